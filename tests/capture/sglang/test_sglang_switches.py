"""`sglang-switches` / `apply --target sglang` per SGLang version: what each version gets (nothing where
the optimisation is upstream, a refusal where nothing applies it, the drop-in launcher where one has
a slot), the env and flags files, and never overwriting a user's file. The table's facts are held
against SGLang's wheels in tests/sglang/test_sglang_wheels.py."""

from __future__ import annotations

import os
import re

import pytest
from typer.testing import CliRunner

from dsv4opt.capture.sglang import MAPPINGS, apply_to_sglang, sglang_summary
from dsv4opt.capture.sglang import switches as S
from dsv4opt.cli import app
from dsv4opt.errors import DsvOptError
from dsv4opt.optimizations import sglang_versions as V
from dsv4opt.optimizations.registry import OPTIMIZATIONS

NEW, OLD = "0.5.23", "0.5.14"


def test_mappings_name_registered_optimisations_and_the_rest_say_so():
    assert set(MAPPINGS) <= set(OPTIMIZATIONS) and {"mma-attn", "bf16-gemm", "grouped-moe"} <= set(MAPPINGS)
    for name in set(OPTIMIZATIONS) - set(MAPPINGS):  # a mapping is optional (docs/architecture.md)
        with pytest.raises(DsvOptError, match="no SGLang mapping yet"):
            S.mapping_for(name)


def test_every_version_covers_every_mapping_on_every_family():
    for v in V.VERSIONS.values():
        for name in MAPPINGS:
            for family in V.FAMILIES:
                part = v.part(name, family)
                assert part is not None and part.sglang_runs, (v.version, name, family)
                assert part.upstream or part.slots or part.env or part.note, (v.version, name, family)
        for switches in v.switches.values():
            assert all(re.fullmatch(r"SGLANG_[A-Z0-9_]+", s.name) and s.default and s.source for s in switches)


def _assignments(text: str) -> dict[str, str]:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert all(re.fullmatch(r"[A-Z0-9_]+=\S+", ln) for ln in lines), lines
    return dict(ln.split("=", 1) for ln in lines)


@pytest.mark.parametrize("version", [OLD, NEW])
def test_mma_attn_gets_the_launcher_and_no_switch_that_does_nothing(tmp_path, version):
    env, flags, script = apply_to_sglang("mma-attn", tmp_path, sglang_version=version)
    text = env.read_text()
    assert _assignments(text) == {}  # 0.5.14 has no tensor-core choice; 0.5.23's default already is one
    assert f"SGLang {version}" in text and "restart" in text.lower()
    if version == NEW:
        assert "SGLANG_SM120_FLASHMLA_BACKEND: flashinfer by default" in text
        assert "sglang.kernels.ops.attention.flash_mla_interface.flash_mla_with_kvcache" in text
    else:
        assert "SGLANG_SM120_TRITON_FLASHMLA: 1 by default" in text and "SGLANG_SM120_FLASHMLA_BACKEND" not in text
    assert [ln for ln in flags.read_text().splitlines() if not ln.startswith("#")] == []
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/bin/sh" and script.stat().st_mode & 0o111 == 0o111 & ~_umask()
    assert lines[-1] == 'exec "${PYTHON:-python}" -m dsv4opt.sglang.launch --with mma-attn -- "$@"'
    assert any(f"Written for SGLang {version} on" in ln for ln in lines)


@pytest.mark.parametrize("name, says", [
    ("bf16-gemm", "bf16-gemm: already upstream in SGLang 0.5.23 (sm_120: the indexer runs TileLang's FP8 kernel"),
    ("grouped-moe", "grouped-moe: already upstream in SGLang 0.5.23 (sm_120: the experts run FlashInfer's CUTLASS "
                    "MXFP8 x MXFP4 grouped GEMM"),
])
def test_upstream_on_0_5_23_writes_nothing_and_says_so(tmp_path, name, says):
    assert apply_to_sglang(name, tmp_path / "out", sglang_version=NEW) == []
    assert not (tmp_path / "out").exists()
    assert sglang_summary(name, NEW).startswith(says)
    r = CliRunner().invoke(app, ["sglang-switches", name, "--sglang-version", NEW, "--out", str(tmp_path)])
    assert r.exit_code == 0 and says.split(" (")[0] in r.output and "wrote" not in r.output


def test_bf16_gemm_on_0_5_14_is_refused_with_the_reason(tmp_path):
    with pytest.raises(DsvOptError, match=r"bf16-gemm cannot be applied to SGLang 0\.5\.14: .*server_args\.py:3787-3799"):
        apply_to_sglang("bf16-gemm", tmp_path, sglang_version=OLD)
    r = CliRunner().invoke(app, ["sglang-switches", "bf16-gemm", "--sglang-version", OLD, "--out", str(tmp_path)])
    assert r.exit_code == 1 and "Traceback" not in r.output and "whatever the environment holds" in r.output


def test_a_new_version_is_one_table_entry(tmp_path, monkeypatch):
    # A version where a switch applies the fix: the env file sets it, describe says so.
    part = V.Part(sglang_runs="the float32 path", env=(V.EnvSetting("SGLANG_MADE_UP", "1", "the tensor-core path"),))
    fake = V.SGLangVersion("9.0.0", "made up for this test", "3.0", switches={}, parts={
        ("bf16-gemm", V.SM120): part, ("bf16-gemm", V.SM90): V.Part("x", upstream="done")})
    monkeypatch.setitem(V.VERSIONS, "9.0.0", fake)
    env, flags = apply_to_sglang("bf16-gemm", tmp_path, sglang_version="9.0.0")
    assert _assignments(env.read_text()) == {"SGLANG_MADE_UP": "1"}
    summary = sglang_summary("bf16-gemm", "9.0.0")
    assert "Sets SGLANG_MADE_UP=1" in summary and "Already upstream on Hopper" in summary


def test_unknown_or_missing_versions_are_refused_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(DsvOptError, match=r"^SGLang 0\.5\.20 is not a version dsv4opt knows \(0\.5\.14, 0\.5\.23\)$"):
        apply_to_sglang("mma-attn", tmp_path, sglang_version="0.5.20")
    monkeypatch.setattr(V, "installed", lambda: None)
    with pytest.raises(DsvOptError, match="SGLang is not installed here: name the server's version with --sglang-version"):
        apply_to_sglang("mma-attn", tmp_path)
    monkeypatch.setattr(V, "installed", lambda: "0.5.9")
    r = CliRunner().invoke(app, ["sglang-switches", "mma-attn", "--out", str(tmp_path)])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "SGLang 0.5.9 is installed here, not a version dsv4opt knows (0.5.14, 0.5.23)" in r.output
    monkeypatch.setattr(V, "installed", lambda: NEW)  # the installed one is used when none is named
    assert len(apply_to_sglang("mma-attn", tmp_path)) == 3


def test_same_files_again_are_fine_but_a_users_file_is_kept(tmp_path):
    apply_to_sglang("mma-attn", tmp_path, sglang_version=NEW)
    apply_to_sglang("mma-attn", tmp_path, sglang_version=NEW)  # identical content: nothing to protect
    env = tmp_path / "sglang-mma-attn.env"
    with pytest.raises(DsvOptError, match="already exists; pass --force to replace it"):
        apply_to_sglang("mma-attn", tmp_path, sglang_version=OLD)  # another version's text
    mine = "MY_SETTING=1\n"
    env.write_text(mine)
    with pytest.raises(DsvOptError, match="already exists; pass --force to replace it"):
        apply_to_sglang("mma-attn", tmp_path, sglang_version=NEW)
    assert env.read_text() == mine
    apply_to_sglang("mma-attn", tmp_path, force=True, sglang_version=NEW)
    assert env.read_text() != mine


def test_force_replaces_a_users_file_and_nothing_else_does(tmp_path):
    script = tmp_path / "sglang-mma-attn-launch.sh"
    script.write_text("#!/bin/sh\nmy own\n")
    args = ["sglang-switches", "mma-attn", "--sglang-version", NEW, "--out", str(tmp_path)]
    with pytest.raises(DsvOptError, match="already exists; pass --force to replace it"):
        apply_to_sglang("mma-attn", tmp_path, sglang_version=NEW)
    assert script.read_text() == "#!/bin/sh\nmy own\n" and not (tmp_path / "sglang-mma-attn.env").exists()
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    forced = CliRunner().invoke(app, args + ["--force"])
    assert forced.exit_code == 0, forced.output
    assert "dsv4opt.sglang.launch --with mma-attn" in script.read_text()
    assert "sglang-mma-attn-launch.sh" in forced.output


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_unknown_name():
    with pytest.raises(DsvOptError, match="known: mma-attn"):
        apply_to_sglang("fast-everything", ".", sglang_version=NEW)


def test_apply_command_with_sglang_target(tmp_path):
    # `dsv4opt apply NAME --target sglang` is wired onto apply_to_sglang and describe.
    result = CliRunner().invoke(app, ["apply", "mma-attn", "--target", "sglang", "--sglang-version", NEW,
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sglang-mma-attn-launch.sh").is_file()
    said = " ".join(result.output.split())  # the console wraps at 80 columns
    assert "mma-attn on SGLang 0.5.23" in said and "not verified on a live server" in said
