"""The drop-in launcher against stand-in `sglang` packages written into a tmp dir, laid out as 0.5.14
or as 0.5.23: it refuses in one line, naming the SGLang versions it was written for, whatever is
wrong with the installed one; and when all is right, the attribute SGLang's dispatcher or backend
looks up is ours, for the version and GPU family, in the launcher's process and in a worker process
spawned the way SGLang starts its schedulers (through dsv4opt's plugin). The real modules of each
version: tests/sglang/test_sglang_wheels.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsv4opt.cli import app
from dsv4opt.optimizations.mma_attn import sglang_entry
from dsv4opt.sglang import dropins, launch
from tests.helpers import REPO

OURS = "dsv4opt.optimizations.mma_attn.sglang_entry.flash_mla_sparse_decode_triton"
ENTRY = (
    "def flash_mla_sparse_decode_triton(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale,\n"
    "                                   extra_k_cache=None, extra_indices=None, extra_topk_length=None):\n"
    "    return 'sglang'\n"
)
# Mirrors flash_mla_sm120.py:203-238: the entry point imported inside the function, on every call.
DISPATCHER = """
_sm120_default_backend = {backend!r}

def flash_mla_with_kvcache_sm120(**kwargs):
    from sglang.srt.layers.attention.flash_mla_sm120_triton import flash_mla_sparse_decode_triton
    return flash_mla_sparse_decode_triton.__module__ + "." + flash_mla_sparse_decode_triton.__qualname__
"""
# Mirrors plugins/__init__.py: general plugins from the entry points, in every process.
PLUGINS = """
from importlib.metadata import entry_points

def load_plugins():
    for ep in entry_points(group="sglang.srt.plugins"):
        ep.load()()
"""
# Mirrors deepseek_v4_backend.py:74 and :1419-1436: the sm_120 dispatcher only where _is_sm120.
BACKEND = """
from sglang.srt.utils.common import is_sm120_supported

_is_sm120 = is_sm120_supported()

def decode_attention():
    if _is_sm120:
        from sglang.srt.layers.attention.flash_mla_sm120 import flash_mla_with_kvcache_sm120
        return flash_mla_with_kvcache_sm120()
    return "flashmla"
"""
# Mirrors scheduler.py:4070-4083: a worker process loads the plugins first, the model after.
SCHEDULER = """
def run_scheduler_process():
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.layers.attention.deepseek_v4_backend import decode_attention
    return decode_attention()
"""
# Mirrors launch_server.py:58-72 and engine.py:1325 (spawned workers).
LAUNCH_SERVER = """
import sys

if __name__ == "__main__":
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.layers.attention.deepseek_v4_backend import decode_attention
    print("server args:", " ".join(sys.argv[1:]))
    print("main process calls:", decode_attention())
    import multiprocessing as mp
    from sglang.srt.managers.scheduler import run_scheduler_process
    with mp.get_context("spawn").Pool(1) as pool:
        print("worker process calls:", pool.apply(run_scheduler_process))
"""


# 0.5.23: the sm_120 modules under sglang/kernels/ops/attention; the dispatcher calls FlashInfer's
# slot by its module-global name (flash_mla_sm120.py:298-374); off sm_120 the backend binds
# flash_mla_interface.flash_mla_with_kvcache in its __init__ (deepseek_v4_backend.py:1262-1272).
DISPATCHER_23 = """
_sm120_default_backend = {backend!r}

def _flash_mla_flashinfer(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale,
                          extra_k_cache, extra_indices, extra_topk_length):
    return 'sglang'

def flash_mla_with_kvcache_sm120(**kwargs):
    if _sm120_default_backend == "flashinfer":
        return _flash_mla_flashinfer.__module__ + "." + _flash_mla_flashinfer.__qualname__
    from sglang.kernels.ops.attention.flash_mla_sm120_triton import flash_mla_sparse_decode_triton
    return flash_mla_sparse_decode_triton.__module__ + "." + flash_mla_sparse_decode_triton.__qualname__
"""
FLASHMLA_23 = """
def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, descale_q=None, descale_k=None,
                           is_fp8_kvcache=False, indices=None, attn_sink=None, extra_k_cache=None,
                           extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None,
                           kv_format=None, *, use_legacy=True):
    return 'sglang'
"""
BACKEND_23 = """
import functools
from sglang.srt.utils.common import is_sm120_supported

class DeepseekV4AttnBackend:
    def __init__(self):
        from sglang.kernels.ops.attention import flash_mla_interface
        self._flash_mla_with_kvcache = functools.partial(flash_mla_interface.flash_mla_with_kvcache, use_legacy=True)

def decode_attention():
    if is_sm120_supported():
        from sglang.kernels.ops.attention.flash_mla_sm120 import flash_mla_with_kvcache_sm120
        return flash_mla_with_kvcache_sm120()
    fn = DeepseekV4AttnBackend()._flash_mla_with_kvcache.func
    return fn.__module__ + "." + fn.__qualname__
"""
ATTN_23 = "sglang/kernels/ops/attention"


def fake_sglang(root: Path, entry: str | None = ENTRY, backend: str = "triton", sm120: bool = True,
                entry_module: bool = True, version: str = "0.5.14", sm90: bool = False) -> Path:
    files = {
        "sglang/__init__.py": "",
        "sglang/launch_server.py": LAUNCH_SERVER,
        "sglang/srt/plugins/__init__.py": PLUGINS,
        "sglang/srt/managers/scheduler.py": SCHEDULER,
        "sglang/srt/utils/common.py": (f"def is_sm120_supported():\n    return {sm120}\n\n"
                                       f"def is_sm90_supported():\n    return {sm90}\n"),
        f"sglang-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n",
    }
    if version == "0.5.23":
        files |= {
            f"{ATTN_23}/flash_mla_sm120.py": DISPATCHER_23.format(backend=backend),
            f"{ATTN_23}/flash_mla_interface.py": FLASHMLA_23,
            "sglang/srt/layers/attention/deepseek_v4_backend.py": BACKEND_23,
        }
        if entry_module:
            files[f"{ATTN_23}/flash_mla_sm120_triton.py"] = (entry or "X = 1\n").replace(
                "sglang.srt.layers.attention", "sglang.kernels.ops.attention")
    else:
        files |= {
            "sglang/srt/layers/attention/flash_mla_sm120.py": DISPATCHER.format(backend=backend),
            "sglang/srt/layers/attention/deepseek_v4_backend.py": BACKEND,
        }
    if entry_module and version != "0.5.23":
        files["sglang/srt/layers/attention/flash_mla_sm120_triton.py"] = entry or "X = 1\n"
    if not _plugin_registered():
        # A checkout run from its tree (PYTHONPATH=., as on the GPU machine) has no installed
        # metadata: the same entry point `pip install -e .` writes, beside the stand-in sglang.
        files["dsv4opt_from_tree-0.dist-info/METADATA"] = "Metadata-Version: 2.1\nName: dsv4opt-from-tree\nVersion: 0\n"
        files["dsv4opt_from_tree-0.dist-info/entry_points.txt"] = (
            f"[{dropins.PLUGIN_GROUP}]\n{dropins.PLUGIN_NAME} = {dropins.PLUGIN_TARGET}\n")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _plugin_registered() -> bool:
    return any(ep.name == dropins.PLUGIN_NAME for ep in entry_points(group=dropins.PLUGIN_GROUP))


@pytest.fixture
def use_fake(tmp_path, monkeypatch):
    """Put a stand-in sglang first on sys.path, with no sglang module imported before or after."""

    def _use(**kwargs):
        root = fake_sglang(tmp_path / "site", **kwargs)
        monkeypatch.syspath_prepend(str(root))
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setattr(dropins, "_version", lambda: kwargs.get("version", "0.5.14"))
        return root

    yield _use
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]


def refusal(capsys, argv) -> str:
    code = launch.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error:")
    return err


ARGV = ["--with", "mma-attn", "--", "--model-path", "m"]
WRITTEN_FOR = "the mma-attn drop-in is written for SGLang 0.5.14 (sm_120) and 0.5.23 (sm_120/sm_90): pip install sglang==0.5.23"
OURS_23 = {"flashinfer": "dsv4opt.optimizations.mma_attn.sglang_entry.flash_mla_flashinfer", "triton": OURS,
           "flashmla": "dsv4opt.optimizations.mma_attn.sglang_entry.flash_mla_with_kvcache"}


def test_refuses_without_sglang(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang fails as when it is not installed
    err = refusal(capsys, ARGV)
    assert "SGLang is not installed in this Python" in err and WRITTEN_FOR in err


@pytest.mark.parametrize(
    "fake, says",
    [
        (dict(entry_module=False), "SGLang 0.5.14 has no module sglang.srt.layers.attention.flash_mla_sm120_triton"),
        (dict(entry=None), "has no sglang.srt.layers.attention.flash_mla_sm120_triton.flash_mla_sparse_decode_triton"),
        (dict(entry=ENTRY.replace("head_dim_v, softmax_scale", "softmax_scale, head_dim_v")),
         "flash_mla_sparse_decode_triton(q, k_cache, indices, topk_length, attn_sink, softmax_scale, head_dim_v"),
        (dict(entry=ENTRY.replace("extra_topk_length=None", "extra_topk_length=None, out=None")), "out=None) differs"),
        (dict(entry=ENTRY.replace("softmax_scale,\n", "softmax_scale, *,\n")), "differs from"),
    ],
    ids=["no-module", "no-entry-point", "swapped-parameters", "extra-parameter", "keyword-only"],
)
def test_refuses_an_sglang_it_was_not_written_for(use_fake, capsys, fake, says):
    use_fake(**fake)
    err = refusal(capsys, ARGV)
    assert says in err and WRITTEN_FOR in err


def test_refuses_when_sglangs_dispatcher_would_not_call_it(use_fake, capsys):
    use_fake(backend="flashinfer")
    err = refusal(capsys, ARGV)
    assert "_sm120_default_backend is 'flashinfer', not 'triton'" in err and "SGLANG_SM120_TRITON_FLASHMLA" in err


def test_refuses_a_version_it_does_not_know(use_fake, capsys, monkeypatch):
    use_fake()
    monkeypatch.setattr(dropins, "_version", lambda: "0.5.20")
    err = refusal(capsys, ARGV)
    assert "SGLang 0.5.20 is not a version dsv4opt knows (0.5.14, 0.5.23)" in err and WRITTEN_FOR in err


@pytest.mark.parametrize("backend", ["flashinfer", "triton"])
def test_0_5_23_sm120_patch_lands_where_its_dispatcher_looks(use_fake, monkeypatch, backend):
    use_fake(version="0.5.23", backend=backend)
    monkeypatch.delenv(dropins.ENV_WITH, raising=False)
    monkeypatch.setattr(launch, "run_sglang_server", lambda args: None)
    assert launch.main(ARGV) == 0
    from sglang.srt.layers.attention.deepseek_v4_backend import decode_attention

    assert decode_attention() == OURS_23[backend]
    assert os.environ[dropins.ENV_FAMILY] == "sm_120"


def test_0_5_23_refuses_the_torch_backend(use_fake, capsys):
    use_fake(version="0.5.23", backend="torch")
    err = refusal(capsys, ARGV)
    assert "_sm120_default_backend is 'torch', not 'flashinfer' or 'triton'" in err
    assert "SGLANG_SM120_FLASHMLA_BACKEND" in err


def test_0_5_23_hopper_patch_lands_in_what_the_backend_binds(use_fake, monkeypatch):
    use_fake(version="0.5.23", sm120=False, sm90=True)
    monkeypatch.delenv(dropins.ENV_WITH, raising=False)
    monkeypatch.setattr(launch, "run_sglang_server", lambda args: None)
    monkeypatch.setattr(sglang_entry, "_fallback", {})
    assert launch.main(ARGV) == 0
    from sglang.srt.layers.attention.deepseek_v4_backend import decode_attention

    assert decode_attention() == OURS_23["flashmla"]
    assert os.environ[dropins.ENV_FAMILY] == "sm_90"
    assert sglang_entry._fallback["flash_mla_with_kvcache"].__module__ == "sglang.kernels.ops.attention.flash_mla_interface"


def test_0_5_23_refuses_another_gpu_and_the_sm120_path(use_fake, capsys):
    use_fake(version="0.5.23", sm120=False, sm90=False)
    err = refusal(capsys, ARGV)
    assert "neither is_sm120_supported() nor is_sm90_supported() is true here" in err
    err = refusal(capsys, ["--with", "mma-attn", "--force-sm120-path", "--", "x"])
    assert "--force-sm120-path is for SGLang 0.5.14" in err and "FlashMLA's slot without it" in err


def test_refuses_off_sm120(use_fake, capsys):
    use_fake(sm120=False)
    err = refusal(capsys, ARGV)
    assert "runs FlashMLA elsewhere" in err and "--force-sm120-path" in err


def test_force_sm120_path_alone_routes_sglangs_own_kernel(use_fake, monkeypatch):
    # no drop-in: SGLang's own Triton kernel on a non-sm_120 GPU, the baseline to compare with
    use_fake(sm120=False)
    monkeypatch.setattr(launch, "run_sglang_server", lambda args: None)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the import hook stays in this test
    for var in (dropins.ENV_WITH, dropins.ENV_FORCE_SM120):
        monkeypatch.delenv(var, raising=False)
    assert launch.main(["--force-sm120-path", "--", "x"]) == 0
    from sglang.srt.layers.attention.deepseek_v4_backend import decode_attention

    assert decode_attention() == "sglang.srt.layers.attention.flash_mla_sm120_triton.flash_mla_sparse_decode_triton"
    assert os.environ[dropins.ENV_FORCE_SM120] == "1" and os.environ[dropins.ENV_WITH] == ""


def test_the_sm120_flag_is_set_whether_the_backend_loads_before_or_after(use_fake, monkeypatch):
    from dsv4opt.sglang import sm120_path

    use_fake(sm120=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    sm120_path.force()  # before: set as the module loads
    from sglang.srt.layers.attention import deepseek_v4_backend as backend

    assert backend._is_sm120 is True
    backend._is_sm120 = False
    sm120_path.force()  # after: set at once
    assert backend._is_sm120 is True and not any(isinstance(f, sm120_path._AfterImport) for f in sys.meta_path)


def test_refuses_when_the_plugin_is_not_registered(use_fake, capsys, monkeypatch):
    use_fake()
    monkeypatch.setattr(dropins, "entry_points", lambda group: [])
    assert "plugin (sglang.srt.plugins: dsv4opt) is not registered" in refusal(capsys, ARGV)


def test_refuses_when_sglang_plugins_leaves_it_out(use_fake, capsys, monkeypatch):
    use_fake()
    monkeypatch.setenv("SGLANG_PLUGINS", "someone_else")
    assert "SGLANG_PLUGINS=someone_else leaves out dsv4opt's plugin" in refusal(capsys, ARGV)


@pytest.mark.parametrize(
    "argv, says",
    [(["--with", "bf16-gemm", "--", "x"], "no SGLang drop-in named 'bf16-gemm'; drop-ins: mma-attn"),
     (["--with", "mma-attn", "--model-path", "m"], "put SGLang's launch_server arguments after --")],
    ids=["unknown-name", "no-separator"],
)
def test_refuses_bad_arguments(capsys, argv, says):
    assert says in refusal(capsys, argv)


def test_refuses_to_do_nothing(capsys):
    says = "nothing to do: name a drop-in with --with (mma-attn) or pass --force-sm120-path"
    assert says in refusal(capsys, ["--", "x"])


def test_patch_lands_where_the_dispatcher_looks(use_fake, monkeypatch):
    use_fake()
    monkeypatch.delenv(dropins.ENV_WITH, raising=False)
    monkeypatch.setattr(launch, "run_sglang_server", lambda args: None)
    assert launch.main(ARGV) == 0
    from sglang.srt.layers.attention.flash_mla_sm120 import flash_mla_with_kvcache_sm120

    assert flash_mla_with_kvcache_sm120() == OURS
    assert os.environ[dropins.ENV_WITH] == "mma-attn"


def test_plugin_does_nothing_unless_asked(use_fake, monkeypatch):
    use_fake()
    monkeypatch.delenv(dropins.ENV_WITH, raising=False)
    from dsv4opt.sglang.plugin import load
    from sglang.srt.layers.attention.flash_mla_sm120 import flash_mla_with_kvcache_sm120

    load()
    assert flash_mla_with_kvcache_sm120() == "sglang.srt.layers.attention.flash_mla_sm120_triton.flash_mla_sparse_decode_triton"
    monkeypatch.setenv(dropins.ENV_WITH, "mma-attn")
    load()
    assert flash_mla_with_kvcache_sm120() == OURS


def test_pyproject_registers_the_plugin():
    text = (REPO / "pyproject.toml").read_text()
    assert f'[project.entry-points."{dropins.PLUGIN_GROUP}"]\n{dropins.PLUGIN_NAME} = "{dropins.PLUGIN_TARGET}"' in text
    from dsv4opt.optimizations.sglang_versions import NEWEST

    assert f'sglang = ["sglang=={NEWEST}"]' in text


@pytest.mark.slow
def test_written_launcher_runs_sglangs_server_with_the_drop_in_in_its_workers(tmp_path):
    # `dsv4opt sglang-switches mma-attn` writes the script; the script runs the launcher, the
    # stand-in's launch_server __main__ and a worker spawned as SGLang spawns its schedulers.
    (tmp_path / "deploy").mkdir()
    result = CliRunner().invoke(app, ["sglang-switches", "mma-attn", "--sglang-version", "0.5.14",
                                      "--out", str(tmp_path / "deploy")])
    assert result.exit_code == 0, result.output
    script = tmp_path / "deploy" / "sglang-mma-attn-launch.sh"
    site = fake_sglang(tmp_path / "site")
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    env.pop(dropins.ENV_WITH, None)
    env.pop("SGLANG_PLUGINS", None)
    run = subprocess.run([str(script), "--model-path", "m"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "server args: --model-path m" in run.stdout
    assert f"main process calls: {OURS}" in run.stdout
    assert f"worker process calls: {OURS}" in run.stdout
    assert "dsv4opt: mma-attn replaces sglang.srt.layers.attention.flash_mla_sm120_triton" in run.stderr


@pytest.mark.slow
def test_0_5_23_hopper_workers_run_the_drop_in(tmp_path):
    site = fake_sglang(tmp_path / "site", version="0.5.23", sm120=False, sm90=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    for var in (dropins.ENV_WITH, dropins.ENV_FAMILY, dropins.ENV_FORCE_SM120, "SGLANG_PLUGINS"):
        env.pop(var, None)
    run = subprocess.run([sys.executable, "-m", "dsv4opt.sglang.launch", *ARGV], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    ours = OURS_23["flashmla"]
    assert f"main process calls: {ours}" in run.stdout and f"worker process calls: {ours}" in run.stdout
    assert "SGLang 0.5.23 (sm_90" in run.stderr


@pytest.mark.slow
def test_force_sm120_path_puts_the_drop_in_under_a_hopper_servers_workers(tmp_path):
    site = fake_sglang(tmp_path / "site", sm120=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    for var in (dropins.ENV_WITH, dropins.ENV_FORCE_SM120, "SGLANG_PLUGINS"):
        env.pop(var, None)
    argv = ["--with", "mma-attn", "--force-sm120-path", "--", "--model-path", "m"]
    run = subprocess.run([sys.executable, "-m", "dsv4opt.sglang.launch", *argv], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"main process calls: {OURS}" in run.stdout and f"worker process calls: {OURS}" in run.stdout
