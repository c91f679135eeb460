"""`dsv4opt profile` on the embedded workload, end to end through the CLI on the CPU."""

import json

from typer.testing import CliRunner

from dsv4opt.analysis.categories import CATEGORIES
from dsv4opt.analysis.profile import Profile
from dsv4opt.cli import app

runner = CliRunner()
TINY_RUN = ["profile", "--config", "dsv4-tiny", "--device", "cpu", "--concurrency", "2", "--context", "24",
            "--steps", "2", "--warmup", "1"]


def test_profile_tiny_on_cpu_writes_a_labelled_profile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    traces = tmp_path / "traces"
    traces.mkdir()
    r = runner.invoke(app, TINY_RUN + ["--trace-dir", str(traces)])
    assert r.exit_code == 0, r.output
    assert "CPU" in r.output
    saved = list((tmp_path / "profiles").glob("embedded-dsv4-tiny-c2-baseline-*.json"))
    assert len(saved) == 1 and f"profile saved: {saved[0].relative_to(tmp_path)}" in r.output
    prof = Profile.load(saved[0])
    assert prof.time_basis == "cpu_self" and prof.meta["device"] == "cpu"
    meta = prof.meta
    assert (meta["target"], meta["config"], meta["concurrency"], meta["context"]) == ("embedded", "dsv4-tiny", 2, 24)
    assert meta["layers"] == 6 and meta["optimizations"] == [] and meta["torch"] and "date" in meta
    assert prof.throughput["ms_per_step"] > 0
    assert abs(prof.throughput["tokens_per_s"] - 2 * 1000 / prof.throughput["ms_per_step"]) < 1e-6
    # CPU operators land in the same fixed categories as GPU kernels, so the loop can run on a CPU
    assert prof.kernels and all(k.category in CATEGORIES for k in prof.kernels)
    assert {c.category for c in prof.categories} >= {"gemm_fp32_simt", "elementwise"}
    assert prof.steps["count"] == 2 and prof.parts
    # The raw trace was kept, and it holds the model-part ranges the analysis attributes time to.
    kept = list(traces.glob("*.trace.json"))
    assert len(kept) == 1
    names = {e.get("name") for e in json.loads(kept[0].read_text())["traceEvents"]}
    assert {"attn", "indexer", "compress", "mhc_pre", "mhc_post", "moe", "qkv", "o_proj", "lm_head"} <= names
    assert any(str(n).startswith("ProfilerStep#") for n in names)


def test_profile_refuses_an_existing_out(tmp_path):
    out = tmp_path / "mine.json"
    out.write_text("{}")
    r = runner.invoke(app, TINY_RUN + ["--out", str(out)])
    assert r.exit_code == 1 and "exists" in r.output
    assert out.read_text() == "{}"


def test_profile_unknown_config_is_one_line(tmp_path):
    r = runner.invoke(app, ["profile", "--config", "dsv4-huge", "--device", "cpu", "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 1 and "dsv4-tiny" in r.output and "Traceback" not in r.output


def test_many_timed_windows_stay_inside_the_caches_and_rope_tables(tmp_path, monkeypatch):
    """Every step a run takes (warm-up, profiler warm-up, profiled, `--repeat` timed windows)
    advances each request by a token: the workload must be built for all of them. Six windows of
    four steps once ran past the RoPE table (an IndexError from the README's own command)."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["profile", "--config", "dsv4-tiny", "--device", "cpu", "--concurrency", "2", "--context", "24",
                            "--steps", "4", "--warmup", "2", "--repeat", "6", "--layers", "2", "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    assert len(Profile.load(tmp_path / "p.json").throughput["ms_per_step_windows"]) == 6
