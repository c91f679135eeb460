"""The SGLang switch mapping: complete, rendered as env/flags files, never overwriting a user's file."""

from __future__ import annotations

import os
import re

import pytest
from typer.testing import CliRunner

from dsv4opt.capture.sglang import MAPPINGS, apply_to_sglang, sglang_summary
from dsv4opt.capture.sglang.switches import SOURCES
from dsv4opt.cli import app
from dsv4opt.errors import DsvOptError
from dsv4opt.optimizations.registry import OPTIMIZATIONS


def test_mappings_name_registered_optimisations_and_the_rest_say_so():
    assert set(MAPPINGS) <= set(OPTIMIZATIONS) and {"mma-attn", "bf16-gemm"} <= set(MAPPINGS)
    from dsv4opt.capture.sglang.switches import mapping_for

    for name in set(OPTIMIZATIONS) - set(MAPPINGS):  # a mapping is optional (docs/architecture.md)
        with pytest.raises(DsvOptError, match="no SGLang mapping yet"):
            mapping_for(name)


def test_mapping_carries_its_provenance():
    assert any(s.commit and re.fullmatch(r"[0-9a-f]{40}", s.commit) for s in SOURCES)
    for m in MAPPINGS.values():
        assert m.restart and m.older_versions and m.env
        for s in m.env:
            assert re.fullmatch(r"SGLANG_[A-Z0-9_]+", s.name) and s.value and s.confirmed


def test_switches_read_from_sglang():
    # The values that SGLang's source says select the fast paths (environ.py, overrides.py).
    env = {o: {s.name: s.value for s in m.env} for o, m in MAPPINGS.items()}
    assert env["mma-attn"] == {"SGLANG_SM120_FLASHMLA_BACKEND": "flashinfer"}
    assert env["bf16-gemm"]["SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"] == "0"
    assert env["bf16-gemm"]["SGLANG_OPT_USE_TILELANG_MHC_PRE"] == "1"
    assert env["bf16-gemm"]["SGLANG_OPT_DEEPGEMM_HC_PRENORM"] == "1"


def _assignments(text: str) -> dict[str, str]:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    assert all(re.fullmatch(r"[A-Z0-9_]+=\S+", ln) for ln in lines), lines
    return dict(ln.split("=", 1) for ln in lines)


@pytest.mark.parametrize("name", sorted(MAPPINGS))
def test_apply_writes_env_and_flags(tmp_path, name):
    env_path, flags_path, *_ = apply_to_sglang(name, tmp_path)
    assert env_path.name == f"sglang-{name}.env" and flags_path.name == f"sglang-{name}.flags"
    assert _assignments(env_path.read_text()) == {s.name: s.value for s in MAPPINGS[name].env}
    flags = [ln for ln in flags_path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert flags == list(MAPPINGS[name].launch_flags)
    assert "restart" in env_path.read_text().lower() and "restart" in sglang_summary(name).lower()


def test_same_files_again_are_fine_but_a_users_file_is_kept(tmp_path):
    apply_to_sglang("mma-attn", tmp_path)
    apply_to_sglang("mma-attn", tmp_path)  # identical content: nothing to protect
    mine = tmp_path / "sglang-bf16-gemm.env"
    mine.write_text("MY_SETTING=1\n")
    with pytest.raises(DsvOptError, match="already exists; pass --force to replace it"):
        apply_to_sglang("bf16-gemm", tmp_path)
    assert mine.read_text() == "MY_SETTING=1\n"
    assert not (tmp_path / "sglang-bf16-gemm.flags").exists()
    apply_to_sglang("bf16-gemm", tmp_path, force=True)
    assert mine.read_text() != "MY_SETTING=1\n"


def test_mma_attn_also_gets_the_drop_in_launcher(tmp_path):
    paths = apply_to_sglang("mma-attn", tmp_path)
    script = tmp_path / "sglang-mma-attn-launch.sh"
    assert paths[-1] == script and script.stat().st_mode & 0o111 == 0o111 & ~_umask()
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/bin/sh"
    assert lines[-1] == 'exec "${PYTHON:-python}" -m dsv4opt.sglang.launch --with mma-attn -- "$@"'
    assert any("SGLang 0.5.14 (sgl-project/sglang@37ef295c7)" in ln for ln in lines)
    assert len(apply_to_sglang("bf16-gemm", tmp_path)) == 2  # no drop-in there


def test_force_replaces_a_users_file_and_nothing_else_does(tmp_path):
    script = tmp_path / "sglang-mma-attn-launch.sh"
    script.write_text("#!/bin/sh\nmy own\n")
    with pytest.raises(DsvOptError, match="already exists; pass --force to replace it"):
        apply_to_sglang("mma-attn", tmp_path)
    assert script.read_text() == "#!/bin/sh\nmy own\n" and not (tmp_path / "sglang-mma-attn.env").exists()
    runner = CliRunner()
    refused = runner.invoke(app, ["sglang-switches", "mma-attn", "--out", str(tmp_path)])
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    forced = runner.invoke(app, ["sglang-switches", "mma-attn", "--out", str(tmp_path), "--force"])
    assert forced.exit_code == 0, forced.output
    assert "dsv4opt.sglang.launch --with mma-attn" in script.read_text()
    assert "sglang-mma-attn-launch.sh" in forced.output


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_unknown_name():
    with pytest.raises(DsvOptError, match="known: mma-attn"):
        apply_to_sglang("fast-everything", ".")


def test_cli_command(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["sglang-switches", "bf16-gemm", "--out", str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "sglang-bf16-gemm.env").is_file() and "not verified on a live server" in ok.output
    bad = runner.invoke(app, ["sglang-switches", "nope", "--out", str(tmp_path)])
    assert bad.exit_code == 1 and "unknown optimisation" in bad.output and "Traceback" not in bad.output


def test_apply_command_with_sglang_target(tmp_path):
    # `dsv4opt apply NAME --target sglang` is wired onto apply_to_sglang and describe.
    result = CliRunner().invoke(app, ["apply", "mma-attn", "--target", "sglang", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sglang-mma-attn.env").is_file() and "SGLANG_SM120_FLASHMLA_BACKEND" in result.output
