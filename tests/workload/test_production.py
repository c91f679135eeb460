"""SGLang 0.5.23's own kernels, the CPU half: the cache and its one-line reasons, the build's refusals,
pack and unpack, and the format conversions the callers make (checked against plain loops written
from SGLang's kernels, not against the code under test). Nothing here downloads or compiles."""

from __future__ import annotations

import ctypes
import json
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dsv4opt.cli import app
from dsv4opt.errors import DsvOptError
from dsv4opt.workload.production import act_quant, artefacts, build, marlin, mhc_tilelang, tilelang_aot
from dsv4opt.workload.production.artefacts import DEEPGEMM, MARLIN, MHC, TVM_FFI, Machine

HOPPER = Machine((9, 0), "/usr/bin/nvcc", (3, 12))


def fake_family(cache: Path, key: str, files=("a.bin",)) -> None:
    """A finished build as build.py leaves it: its files, then its manifest."""
    folder = cache / key
    folder.mkdir(parents=True)
    for f in files:
        (folder / f).write_bytes(b"x")
    (folder / artefacts.MANIFEST).write_text(json.dumps({"family": key, "files": list(files)}))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "kernels"
    monkeypatch.setenv(artefacts.CACHE_ENV, str(path))
    return path


# ---- the cache ----------------------------------------------------------------------------------

def test_cache_dir_env_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv(artefacts.CACHE_ENV, str(tmp_path / "c"))
    assert artefacts.cache_dir() == tmp_path / "c"
    monkeypatch.delenv(artefacts.CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert artefacts.cache_dir() == tmp_path / ".cache" / "dsv4opt" / "sglang-0.5.23"


def test_present_needs_manifest_and_every_file(cache):
    assert not artefacts.present(MHC, cache)
    (cache / MHC).mkdir(parents=True)
    (cache / MHC / "a.cubin").write_bytes(b"x")
    assert not artefacts.present(MHC, cache)  # an interrupted build: no manifest
    (cache / MHC / artefacts.MANIFEST).write_text(json.dumps({"files": ["a.cubin", "b.cubin"]}))
    assert not artefacts.present(MHC, cache)  # a listed file is missing
    (cache / MHC / "b.cubin").write_bytes(b"x")
    assert artefacts.present(MHC, cache)


@pytest.mark.parametrize(
    "built, machine, family, reason",
    [
        ((), HOPPER, DEEPGEMM, "no deep_gemm build in {cache}; run `dsv4opt build-kernels`"),
        ((MARLIN,), HOPPER, MARLIN, "no tvm-ffi build in {cache}; run `dsv4opt build-kernels`"),
        ((DEEPGEMM,), Machine(None, "/usr/bin/nvcc", (3, 12)), DEEPGEMM, "no CUDA GPU here"),
        ((MHC,), Machine((12, 0), None, (3, 12)), MHC, "built for Hopper (sm_90a); this GPU is sm_120"),
        ((DEEPGEMM,), Machine((9, 0), "/usr/bin/nvcc", (3, 11)), DEEPGEMM,
         "the cached DeepGEMM _C is built for CPython 3.12; this is 3.11"),
        ((DEEPGEMM,), Machine((9, 0), None, (3, 12)), DEEPGEMM,
         "DeepGEMM compiles its kernels at first use: set CUDA_HOME or put nvcc on PATH"),
        ((MARLIN, TVM_FFI), Machine((9, 0), None, (3, 11)), MARLIN,
         "the cached apache-tvm-ffi is a cp312-abi3 build; this is CPython 3.11"),
    ],
    ids=["nothing-built", "marlin-without-tvm-ffi", "no-gpu", "sm120", "python-3.11", "no-nvcc", "tvm-ffi-abi"],
)
def test_one_line_reasons(cache, built, machine, family, reason):
    for key in built:
        fake_family(cache, key)
    (row,) = [a for a in artefacts.availability(cache, machine) if a.family.key == family]
    assert not row.ready
    assert row.reason == reason.format(cache=cache)
    assert "\n" not in row.line() and row.line().endswith(f"stand-in ({row.reason})")


def test_everything_ready_on_hopper(cache):
    for key in (DEEPGEMM, MARLIN, TVM_FFI, MHC):
        fake_family(cache, key)
    lines = artefacts.status_lines(cache, HOPPER)
    assert lines == ["DeepGEMM: SGLang 0.5.23's kernel", "Marlin MoE: SGLang 0.5.23's kernel",
                     "TileLang mHC: SGLang 0.5.23's kernel"]


# ---- the build's refusals, pack and unpack ------------------------------------------------------

def test_unknown_family(cache):
    with pytest.raises(DsvOptError, match="unknown kernel family cutlass; use deep_gemm, marlin, mhc"):
        build.build_kernels(["cutlass"], cache=cache)


def test_cache_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(DsvOptError, match="is a file"):
        build.build_kernels([DEEPGEMM], cache=path)


def test_marlin_needs_nvcc(cache, monkeypatch):
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    with pytest.raises(DsvOptError, match="building Marlin needs nvcc"):
        build.build_kernels([MARLIN], cache=cache)
    assert not cache.exists()  # refused before anything was made


def test_mhc_needs_tilelang(cache, monkeypatch):
    with pytest.raises(DsvOptError, match="cannot import tilelang"):
        build.build_kernels([MHC], cache=cache, tilelang_python=sys.executable)  # the test venv has none


def test_mhc_makes_its_tilelang_venv_once(cache, monkeypatch):
    """Without --tilelang-python the build makes the cache's own venv (this Python's packages visible,
    so tilelang takes the torch installed here) with SGLang's pin; a failure is one line."""
    import subprocess

    monkeypatch.delenv("DSV4OPT_TILELANG_PYTHON", raising=False)
    ran = []

    def fake_run(cmd, **kw):
        ran.append(cmd)
        failed = "pip" in cmd and fail_pip
        return subprocess.CompletedProcess(cmd, 1 if failed else 0, stdout="", stderr="ERROR: no network")

    monkeypatch.setattr(build.subprocess, "run", fake_run)
    fail_pip = True
    with pytest.raises(DsvOptError, match=r"^could not make the tilelang venv \(.*pip install: ERROR: no network\)"):
        build.build_kernels([MHC], cache=cache, say=lambda line: None)
    venv = cache / build.TILELANG_VENV
    assert ran[0] == [sys.executable, "-m", "venv", str(venv)]
    assert ran[1][-2:] == ["tilelang==0.1.12", "z3-solver<4.15.5"] and ran[1][0] == str(venv / "bin" / "python")
    # this interpreter's packages (its torch) are visible inside, whatever venv it runs in
    import site

    (pth,) = (venv / "lib").glob("python*/site-packages/dsv4opt-host-packages.pth")
    assert site.getsitepackages()[0] in pth.read_text().splitlines()


def test_built_families_are_skipped(cache):
    fake_family(cache, DEEPGEMM)
    said = []
    assert build.build_kernels([DEEPGEMM], cache=cache, say=said.append) == []
    assert said == [f"deep_gemm: already in {cache / DEEPGEMM} (--force rebuilds it)"]


def fake_vllm_wheel(path: Path, version: str = "2.5.0") -> Path:
    wheel = path / "vllm-0.23.0-2-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        root = "vllm/third_party/deep_gemm/"
        z.writestr(root + "__init__.py", f"__version__ = '{version}'\n")
        z.writestr(root + "include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh", "//")
        z.writestr(root + "__pycache__/envs.cpython-312.pyc", "")
        for py in ("310", "311", "312", "313"):
            z.writestr(root + f"_C.cpython-{py}-x86_64-linux-gnu.so", py)
        z.writestr("vllm/other.py", "")
    return wheel


def test_deep_gemm_from_a_local_wheel(cache, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_vllm_wheel(wheels)
    steps = build.build_kernels([DEEPGEMM], cache=cache, wheels=wheels, say=lambda s: None)
    assert [s.what.split(" ->")[0] for s in steps][-1] == DEEPGEMM
    manifest = json.loads((cache / DEEPGEMM / artefacts.MANIFEST).read_text())
    assert set(manifest["files"]) == {"__init__.py", "_C.cpython-312-x86_64-linux-gnu.so",
                                      "include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh"}
    assert manifest["version"] == "2.5.0" and artefacts.present(DEEPGEMM, cache)
    assert not list(cache.glob(".staging-*"))


def test_deep_gemm_of_another_version_is_refused(cache, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_vllm_wheel(wheels, version="2.6.0")
    with pytest.raises(DsvOptError, match="bundles DeepGEMM 2.6.0"):
        build.build_kernels([DEEPGEMM], cache=cache, wheels=wheels, say=lambda s: None)
    assert not (cache / DEEPGEMM).exists() and not list(cache.glob(".staging-*"))


def test_pack_refusals_and_round_trip(cache, tmp_path):
    out = tmp_path / "k.tar.gz"
    with pytest.raises(DsvOptError, match="nothing built"):
        build.pack(out, cache)
    fake_family(cache, MHC, files=("post.cubin", "variants.json"))
    build.pack(out, cache)
    with pytest.raises(DsvOptError, match="already exists"):
        build.pack(out, cache)
    other = tmp_path / "other"
    assert build.unpack(out, other) == [MHC]
    assert artefacts.present(MHC, other)
    assert build.unpack(out, other) == []  # present families are left alone


def test_marlin_wrapper_is_sglangs_unit():
    text = build.marlin_wrapper(Path("/src/gemm/marlin_moe/moe_wna16_marlin.cuh"), build.MARLIN_SPECS["gemm2"])
    assert text.splitlines()[:5] == [f"#include <{h}>" for h in build.FFI_INCLUDES]
    assert '#include "/src/gemm/marlin_moe/moe_wna16_marlin.cuh"' in text
    assert ("TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_wna16_marlin_gemm, (moe_wna16_marlin_gemm<bf16_t, false, false, "
            "true, true, true>));") in text


def test_cli_status_and_refusal(cache):
    runner = CliRunner()
    result = runner.invoke(app, ["build-kernels", "--status"])
    assert result.exit_code == 0 and "TileLang mHC: stand-in" in result.output
    result = runner.invoke(app, ["build-kernels", "--only", "cutlass"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["error: unknown kernel family cutlass; use deep_gemm, marlin, mhc"]


# ---- TileLang ahead of time ---------------------------------------------------------------------

def test_tilelang_extract_keeps_decorators_and_refuses_other_files():
    source = "\n".join(
        ["import x", "", "@tilelang.jit(", "    pass_configs={},", ")", "def mhc_post_tilelang(a, hc: int):",
         "    return a", ""]
        + [f"def {name}():\n    pass\n" for name in tilelang_aot.KERNELS if name != "mhc_post_tilelang"])
    text, spans = tilelang_aot.extract(source)
    assert "@tilelang.jit(\n    pass_configs={},\n)\ndef mhc_post_tilelang" in text
    assert spans["mhc_post_tilelang"] == [3, 7]
    with pytest.raises(SystemExit, match="not found"):
        tilelang_aot.extract("def other():\n    pass\n")


def test_tilelang_variants_are_sglangs_decode_picks():
    assert sorted(tilelang_aot.variants()) == ["big_fuse_s4", "big_fuse_s64", "big_fuse_s8", "fma_t2", "fma_t3", "post"]
    # the split counts mhc_fused_post_pre (and, over 32 tokens or at the first read, the pre-norm GEMM) picks
    picks = {(mhc_tilelang.fma_plan(t, 4096) if t <= 32 else (None, mhc_tilelang.prenorm_splits(t, 16384, 132)))
             for t in range(1, 65)}
    assert picks == {(2, 8), (3, 4), (None, 64)}
    assert mhc_tilelang.prenorm_splits(1, 16384, 132) == 64  # the first read, whatever the batch (<= 64)
    assert mhc_tilelang.prenorm_splits(65, 16384, 132) == 64 and mhc_tilelang.prenorm_splits(129, 16384, 132) == 44


@pytest.mark.parametrize("expr, value", [("num_tokens", 7), ("12", 12), ("(num_tokens + 1) // 2", 4),
                                         ("T.FloorDiv(num_tokens + 5, 4)", 3)])
def test_thread_extents(expr, value):
    assert mhc_tilelang.extent(expr, {"num_tokens": 7, "split_k": 8}) == value


# ---- DeepGEMM's activation quantisation ---------------------------------------------------------

@pytest.mark.parametrize("M, K", [(1, 128), (5, 512), (33, 1024)], ids=["one-token", "odd-rows", "33x1024"])
def test_ue8m0_group_quant_matches_definition(M, K):
    x = (torch.randn(M, K) * torch.logspace(-3, 2, K)).to(torch.bfloat16)
    x[0, :128] = 0  # an all-zero group keeps the eps floor
    q, s = act_quant.group_quant_fp8_ue8m0(x, 128)  # Triton, interpreted
    rq, rs = act_quant.quantize_groups_ue8m0(x.float(), 128)
    assert torch.equal(s, rs) and torch.equal(q.float(), rq.float())
    assert torch.equal(torch.exp2(torch.log2(s).round()), s)  # powers of two
    amax = x.float().view(M, -1, 128).abs().amax(-1)
    assert (amax <= 448 * s).all() and ((amax > 224 * s) | (amax == 0)).all()  # the smallest such power


# ---- Marlin's formats ---------------------------------------------------------------------------

def test_scalar_type_id_of_fe2m1f():
    # exponent 2 | mantissa 1 << 8 | signed << 16 | bias 0 << 17 | finite_values_only << 49 | NAN_NONE << 50
    assert marlin.FE2M1F_ID == 2 + (1 << 8) + (1 << 16) + (1 << 49)


def repack_loop(packed: torch.Tensor) -> torch.Tensor:
    """gptq_marlin_repack (4 bits, no perm) thread by thread, as gptq_marlin_repack.cuh:150-221 does."""
    N, K = packed.shape[0], packed.shape[1] * 2
    qw = packed.view(torch.int32).t().contiguous()  # [K/8, N]: SGLang's `weight[i].view(int32).T`
    n_tiles = N // 64
    out = [0] * (K // 16 * N * 2)
    for kt in range(K // 16):
        for nt in range(n_tiles):
            offset = (kt * n_tiles + nt) * 128
            for w in range(4):
                for t in range(32):
                    col, row = w * 16 + t // 4, (t % 4) * 2
                    vals = []
                    for base in (0, 8):
                        for o in (0, 1, 8, 9):
                            k, n = kt * 16 + row + o, nt * 64 + col + base
                            vals.append((int(qw[k // 8, n]) >> (4 * (k % 8))) & 0xF)
                    res = 0
                    for i, j in enumerate((0, 2, 4, 6, 1, 3, 5, 7)):
                        res |= vals[j] << (4 * i)
                    out[offset + t * 4 + w] = res - (1 << 32) if res >= 1 << 31 else res
    return torch.tensor(out, dtype=torch.int32).view(K // 16, 2 * N)


@pytest.mark.parametrize("N, K", [(64, 16), (128, 64), (64, 96)], ids=["one-tile", "2x4-tiles", "k-6-tiles"])
def test_repack_matches_the_kernels_loop(N, K):
    packed = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8)
    assert torch.equal(marlin.repack_codes(packed), repack_loop(packed))


def test_scales_permuted_as_sglang_does():
    N, G = 128, 4  # K = 128: four groups of 32
    scales = torch.pow(2.0, torch.randint(-8, 3, (N, G)).float())
    out = marlin.permute_scales(scales)
    perm = [i + 8 * j for i in range(8) for j in range(8)]
    ref = scales.t().contiguous().reshape(-1, 64)[:, perm].reshape(-1, N)  # marlin_permute_scales
    ref = ref.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(-1, N)  # mxfp4_marlin_process_scales (bf16)
    assert out.dtype == torch.float8_e8m0fnu and out.shape == (G, N)
    assert torch.equal(out.float(), ref)


def test_align_matches_sglangs_example_and_invariants():
    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32)
    sorted_ids, expert_ids, post = marlin.align(ids, 4, 5)
    # moe_align_block_size's docstring (triton_utils/moe_align_block_size.py)
    assert sorted_ids[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert expert_ids[:4].tolist() == [1, 2, 3, 4] and post.tolist() == [16, 0]
    gen = torch.Generator().manual_seed(1)
    for M, k, E, block in [(1, 6, 256, 8), (37, 6, 256, 8), (64, 6, 256, 8), (300, 6, 256, 16)]:
        ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)]).int()
        sorted_ids, expert_ids, post = marlin.align(ids, block, E)
        numel, total = M * k, int(post[0])
        expected_len = numel * block if numel < E + 1 else numel + (E + 1) * (block - 1)
        assert sorted_ids.numel() == -(-expected_len // 4) * 4 and total % block == 0
        real = sorted_ids[:total][sorted_ids[:total] < numel]
        assert sorted(real.tolist()) == list(range(numel))  # every slot once
        assert (sorted_ids[total:] == numel).all()
        blocks = expert_ids[: total // block]
        assert (blocks[1:] >= blocks[:-1]).all()
        flat = ids.reshape(-1)
        for b in range(total // block):
            slots = sorted_ids[b * block : (b + 1) * block]
            assert (flat[slots[slots < numel].long()] == blocks[b]).all()
    assert marlin.block_size_m(64, 6, 256) == 8 and marlin.block_size_m(400, 6, 256) == 16


def test_launch_structs_have_the_drivers_layout():
    from dsv4opt.workload.production import cubin

    # cuda.h: CUlaunchAttribute {id; pad[8 - sizeof(id)]; union value (64 B)}; CUlaunchConfig: 7 uints,
    # then hStream, attrs, numAttrs
    assert ctypes.sizeof(cubin._LaunchAttribute) == 72 and cubin._LaunchAttribute.value.offset == 8
    assert [getattr(cubin._LaunchConfig, f).offset for f in ("hStream", "attrs", "numAttrs")] == [32, 40, 48]
    assert ctypes.sizeof(cubin._LaunchConfig) == 56


def test_mhc_variants_read_from_the_manifest(cache):
    mhc_tilelang.variants.cache_clear()
    with pytest.raises(DsvOptError, match="no TileLang mHC cubins"):
        mhc_tilelang.variants()
    mhc_tilelang.variants.cache_clear()
    entry = {"constants": {}, "cubin": "post.cubin", "entry": "mhc_post_tilelang_kernel", "dyn_smem": 28672,
             "params": [["a", "handle"], ["x", "handle"], ["num_tokens", "int32"]], "grid": ["num_tokens", "1", "1"],
             "block": [128, 1, 1], "pdl_sync": True}
    fake_family(cache, MHC, files=("post.cubin", "variants.json"))
    (cache / MHC / "variants.json").write_text(json.dumps({"variants": {"post": entry}}))
    (post,) = mhc_tilelang.variants().values()
    assert post.params == ["a", "x", "num_tokens"] and post.kernel.param_types == ("ptr", "ptr", "int32")
    assert [mhc_tilelang.extent(e, {"num_tokens": 5}) for e in post.grid_expr] == [5, 1, 1]
    assert post.kernel.pdl and post.kernel.dyn_smem == 28672
    mhc_tilelang.variants.cache_clear()


def test_cuda_home_through_a_wrapper_script(tmp_path, monkeypatch):
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "bin").mkdir()
    (toolkit / "include" / "cuda.h").write_text("")
    (toolkit / "bin" / "nvcc").write_text("")
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(wrapper.parent))
    assert artefacts.find_cuda_home(usual=()) == str(toolkit)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert artefacts.find_cuda_home(usual=()) is None


def test_nvrtc_gets_a_cuda_folder_with_ccl_beside_the_toolkits_headers(tmp_path):
    """CUDA 13 keeps cuda/std/... in include/cccl/; DeepGEMM gives NVRTC only -I$CUDA_HOME/include."""
    from dsv4opt.workload.production.deepgemm import nvrtc_cuda_home

    home = tmp_path / "cuda"
    for f in ("include/cuda.h", "include/cuda/barrier", "include/cccl/cuda/std/cstdint", "include/cccl/cub/cub.cuh",
              "bin/nvcc"):
        (home / f).parent.mkdir(parents=True, exist_ok=True)
        (home / f).write_text(f)
    got = Path(nvrtc_cuda_home(str(home), under=str(tmp_path)))
    assert got != home
    for f, source in [("include/cuda.h",) * 2, ("include/cuda/barrier",) * 2, ("bin/nvcc",) * 2,
                      ("include/cuda/std/cstdint", "include/cccl/cuda/std/cstdint"),
                      ("include/cub/cub.cuh", "include/cccl/cub/cub.cuh")]:
        assert (got / f).read_text() == source, f
    assert not (got / "include" / "cccl").exists()
    assert nvrtc_cuda_home(str(home), under=str(tmp_path)) == str(got)  # made once
    plain = tmp_path / "cuda12"
    (plain / "include").mkdir(parents=True)
    assert nvrtc_cuda_home(str(plain), under=str(tmp_path)) == str(plain)  # no cccl folder: the toolkit's own
