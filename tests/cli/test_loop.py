"""list / apply / revert / status / recommend / sweep / report through the CLI, failure paths included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsv4opt.analysis.profile import Profile
from dsv4opt.cli import app
from dsv4opt.optimizations.registry import CheckResult, Optimization
from dsv4opt.state import load_state, state_path
from tests.decision.profiles import story_after_attention

runner = CliRunner()
TINY = ["--config", "dsv4-tiny", "--device", "cpu", "--context", "24", "--steps", "2", "--warmup", "1"]


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "160"})


@pytest.fixture
def failing_check(monkeypatch):
    def check(self, device=None):
        return CheckResult(self.name, False, "cpu", {"rel_err": 0.5}, {"rel_err": 0.01}, "rel err 0.5 > 0.01")

    monkeypatch.setattr(Optimization, "check", check)


def test_list_shows_every_optimisation_and_its_gate():
    r = invoke("list")
    assert r.exit_code == 0, r.output
    for text in ("mma-attn", "bf16-gemm", "DSV4OPT_MMA_ATTN=1", "DSV4OPT_BF16_GEMM=1", "not run"):
        assert text in r.output


def test_list_check_shows_each_gates_figures_against_its_bounds(failing_check):
    r = invoke("list", "--check")
    assert r.exit_code == 0, r.output
    for name in ("mma-attn", "bf16-gemm"):
        assert f"{name} check on cpu: FAILED" in r.output
    assert "rel_err" in r.output and "50x" in r.output  # 0.5 against a bound of 0.01
    assert "FAILS on cpu" in r.output


def test_apply_unknown_name_lists_the_known_ones():
    r = invoke("apply", "warp-drive", "--no-reprofile")
    assert r.exit_code == 1
    assert "unknown optimisation 'warp-drive'; known: mma-attn, bf16-gemm" in r.output
    assert "Traceback" not in r.output


def test_apply_with_failing_check_changes_nothing(failing_check):
    r = invoke("apply", "bf16-gemm", "--no-reprofile")
    assert r.exit_code == 1
    assert "FAILED" in r.output and "nothing was changed" in r.output
    assert not state_path().exists()


def test_apply_refuses_a_gpu_only_optimisation_on_a_cpu_loop_before_its_gate(monkeypatch):
    """mma-attn on a CPU would pass its interpreter gate and then make every later profile fail."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    ran = []
    monkeypatch.setattr(Optimization, "check", lambda self, device=None: ran.append(self.name))
    r = invoke("apply", "mma-attn", "--no-reprofile")
    assert r.exit_code == 1 and "runs on cuda; this loop profiles on the cpu" in r.output
    assert ran == [] and not state_path().exists()


def test_apply_twice_and_revert(monkeypatch):
    monkeypatch.setattr(Optimization, "check", lambda self, device=None: CheckResult(
        self.name, True, "cpu", {"rel_err": 0.001}, {"rel_err": 0.01}, "ok"))
    assert invoke("apply", "bf16-gemm", "--no-reprofile").exit_code == 0
    r = invoke("apply", "bf16-gemm", "--no-reprofile")
    assert r.exit_code == 1 and "already on" in r.output
    r = invoke("status")
    assert "on: bf16-gemm" in r.output
    assert invoke("revert", "bf16-gemm").exit_code == 0
    r = invoke("revert", "bf16-gemm")
    assert r.exit_code == 1 and "not on" in r.output


def test_status_on_corrupt_state_then_reset():
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("]]")
    r = invoke("status")
    assert r.exit_code == 1 and "status --reset" in r.output and "Traceback" not in r.output
    r = invoke("status", "--reset")
    assert r.exit_code == 0 and "kept as" in r.output
    assert invoke("status").exit_code == 0
    assert [p.read_text() for p in path.parent.glob("state.json.bak-*")] == ["]]"]


def test_recommend_without_any_profile_says_what_to_do():
    r = invoke("recommend")
    assert r.exit_code == 1 and "dsv4opt profile" in r.output


def test_recommend_on_a_profile_file(tmp_path):
    path = story_after_attention().save(tmp_path / "after.json")
    out = tmp_path / "rec.json"
    r = invoke("recommend", str(path), "--json", str(out))
    assert r.exit_code == 0, r.output
    assert "bf16-gemm *" in r.output
    assert json.loads(out.read_text())["chosen"] == "bf16-gemm"


def test_recommend_on_a_missing_file(tmp_path):
    r = invoke("recommend", str(tmp_path / "nope.json"))
    assert r.exit_code == 1 and "nope.json" in r.output


def test_report_html_and_markdown(tmp_path):
    before = story_after_attention()
    before.meta["optimizations"] = []
    a = before.save(tmp_path / "a.json")
    b = story_after_attention().save(tmp_path / "b.json")
    r = invoke("report", str(a), str(b), "--out", str(tmp_path / "r.html"))
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text()
    assert "data:image/png;base64," in page and "Verdict" in page
    r = invoke("report", str(a), str(b), "--out", str(tmp_path / "r.md"), "--format", "md")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "r-categories.png").read_bytes().startswith(b"\x89PNG")
    r = invoke("report", str(a), "--format", "pdf", "--out", str(tmp_path / "r.pdf"))
    assert r.exit_code == 2 and "'pdf' is not one of 'html', 'md'" in r.output  # typer checks the choice
    assert not (tmp_path / "r.pdf").exists()


def test_report_format_follows_the_out_extension_and_never_overwrites(tmp_path, monkeypatch):
    import os
    import stat

    a = story_after_attention().save(tmp_path / "a.json")
    monkeypatch.chdir(tmp_path)
    r = invoke("report", str(a), "--format", "md")  # no --out: the default file takes the format's name
    assert r.exit_code == 0, r.output
    assert (tmp_path / "report.md").read_text().startswith("#") and not (tmp_path / "report.html").exists()
    r = invoke("report", str(a), "--out", str(tmp_path / "x.md"))  # no --format: the extension decides
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "x.md").read_text().lstrip().startswith("<")
    mode = stat.S_IMODE(os.stat(tmp_path / "x.md").st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # like a file from open(), not mkstemp's 0600
    before = (tmp_path / "x.md").read_bytes()
    r = invoke("report", str(a), "--out", str(tmp_path / "x.md"))
    assert r.exit_code == 1 and "already exists" in r.output and "--force" in r.output
    assert (tmp_path / "x.md").read_bytes() == before
    r = invoke("report", str(a), "--out", str(tmp_path / "x.md"), "--force")
    assert r.exit_code == 0, r.output
    r = invoke("report", str(a), "--out", str(tmp_path / "y.html"), "--format", "md")
    assert r.exit_code == 1 and "must agree" in r.output
    r = invoke("report", str(a), "--out", str(tmp_path / "y.txt"))
    assert r.exit_code == 1 and "--format" in r.output
    r = invoke("report", str(a), "--out", str(tmp_path / "typo" / "r.html"))
    assert r.exit_code == 1 and "does not exist" in r.output and not (tmp_path / "typo").exists()


def test_sweep_rejects_bad_concurrency_list():
    r = invoke("sweep", "--concurrency", "1,x")
    assert r.exit_code == 1 and "whole numbers" in r.output


def test_sweep_passes_the_path_kv_ranks_and_seed_and_its_layout_follows_the_path(tmp_path, monkeypatch):
    """sweep once had no --sglang (nor --kv, --ranks, --seed) and its --layout default was tp4 whatever
    the path; it now takes profile's options, and its layout default is the path's recipe, as profile's."""
    import dsv4opt.loop.sweep as loop_sweep

    seen = []

    def fake(concurrencies, variants, base, **kwargs):
        seen.append(base)
        raise SystemExit(0)

    monkeypatch.setattr(loop_sweep, "sweep", fake)
    monkeypatch.chdir(tmp_path)
    Path("sw").mkdir()
    r = invoke("sweep", "-c", "1", "--sglang", "0.5.23", "--kv", "bf16", "--ranks", "4", "--seed", "7", "--out-dir", "sw")
    assert r.exit_code == 0, r.output
    base = seen[-1]
    assert (base.sglang, base.kv, base.ranks, base.seed, base.layout) == ("0.5.23", "bf16", 4, 7, "tp4")
    r = invoke("sweep", "-c", "1", "--layout", "dp-ep", "--out-dir", "sw")
    assert r.exit_code == 0 and (seen[-1].sglang, seen[-1].layout) == ("0.5.14", "dp-ep")


@pytest.mark.slow
def test_sweep_tiny_on_cpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("sw").mkdir()
    r = invoke("sweep", "--concurrency", "1,2", "--with", "bf16-gemm", *TINY, "--out-dir", "sw")
    assert r.exit_code == 0, r.output
    summary = json.loads(next(Path("sw").glob("sweep-*.json")).read_text())
    rows = summary["rows"]
    assert [(r["concurrency"], r["variant"]) for r in rows] == [
        (1, "baseline"), (1, "bf16-gemm"), (2, "baseline"), (2, "bf16-gemm")]
    for row in rows:
        prof = Profile.load(row["profile"])
        assert prof.meta["concurrency"] == row["concurrency"]
        assert prof.meta["optimizations"] == ([] if row["variant"] == "baseline" else ["bf16-gemm"])
    assert next(Path("sw").glob("sweep-*.png")).read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_profile_then_apply_bf16_gemm_on_cpu_end_to_end(tmp_path, monkeypatch):
    """The whole loop for real on the tiny config: profile, apply (real check), compare."""
    monkeypatch.chdir(tmp_path)
    r = invoke("profile", "--concurrency", "2", *TINY)
    assert r.exit_code == 0, r.output
    first = load_state().last_profile
    # --keep: on a CPU the tiny model's timings swing; whether a slower re-profile is switched back
    # off is tested with fixed timings in tests/loop/test_apply.py
    r = invoke("apply", "bf16-gemm", "--keep")
    assert r.exit_code == 0, r.output
    assert "ms/step" in r.output and "windows" in r.output  # the noise the verdict is judged against
    assert "bf16-gemm check on" in r.output and "passed" in r.output
    state = load_state()
    assert state.enabled == ["bf16-gemm"] and state.last_profile != first
    after = Profile.load(state.last_profile)
    assert after.meta["optimizations"] == ["bf16-gemm"] and after.meta["concurrency"] == 2
    assert Path(first).exists()
    r = invoke("status")
    assert "bf16-gemm" in r.output and state.last_profile in r.output


@pytest.mark.slow
def test_profile_then_apply_fuse_glue_on_cpu_end_to_end(tmp_path, monkeypatch):
    """fuse-glue through the same loop on the tiny config: profile, gate, switch, re-profile, compare."""
    monkeypatch.chdir(tmp_path)
    r = invoke("profile", "--concurrency", "2", *TINY)
    assert r.exit_code == 0, r.output
    first = load_state().last_profile
    r = invoke("apply", "fuse-glue", "--keep")
    assert r.exit_code == 0, r.output
    assert "fuse-glue check on" in r.output and "passed" in r.output
    assert "targeted category glue" in r.output and "ms/step" in r.output
    state = load_state()
    assert state.enabled == ["fuse-glue"] and state.last_profile != first
    after = Profile.load(state.last_profile)
    assert after.meta["optimizations"] == ["fuse-glue"] and Path(first).exists()
    r = invoke("revert", "fuse-glue")
    assert r.exit_code == 0 and load_state().enabled == []
