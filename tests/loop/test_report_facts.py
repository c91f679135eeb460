"""What the report says, worked out by hand from small profiles."""

from __future__ import annotations

import pytest

from dsv4opt.loop.report_facts import build_report
from dsv4opt.report.page import render_html, render_markdown
from tests.decision.profiles import make_profile


def _pair(tmp_path):
    trace = tmp_path / "after.trace.json"
    trace.write_text("{}")
    before = make_profile([("simt_decode", "attention", 50, 4000.0), ("gemm", "gemm_tc", 100, 1000.0)], steps=5,
                          meta={"concurrency": 8, "optimizations": []},
                          throughput={"tokens_per_s": 8000.0, "ms_per_step": 1.0, "ms_per_step_windows": [0.98, 1.0, 1.25]})
    before.steps["steps"] = [{"name": f"ProfilerStep#{i}", "gpu_us": 1000.0 * i, "span_us": 1100.0} for i in (1, 2)]
    after = make_profile([("mma_decode", "attention", 50, 500.0), ("gemm", "gemm_tc", 100, 1000.0)], steps=5,
                         meta={"concurrency": 8, "optimizations": ["mma-attn"], "sources": [str(trace)],
                               "capture_trace": str(tmp_path / "gone.json")},
                         throughput={"tokens_per_s": 20000.0, "ms_per_step": 0.4})
    return build_report(["before.json", "after.json"], [before, after])


def test_time_per_step_by_category_spread_and_traces(tmp_path):
    rep = _pair(tmp_path)
    before, after = rep.facts
    assert before.category_ms == pytest.approx({"attention": 4000.0 / 5 / 1000, "gemm_tc": 1000.0 / 5 / 1000})
    assert after.category_ms == pytest.approx({"attention": 0.1, "gemm_tc": 0.2})
    assert (before.ms_per_step.low, before.ms_per_step.high, before.ms_per_step.windows) == (0.98, 1.25, 3)
    # tokens/s goes as 1 / ms: the slowest window (1.25 ms) is 8000 * 1.0 / 1.25 = 6400 tokens/s
    assert before.tokens_per_s.low == pytest.approx(6400.0) and before.tokens_per_s.high == pytest.approx(8000.0 / 0.98)
    assert after.ms_per_step.low is None and after.ms_per_step.windows == 0
    assert before.step_ms == [1.0, 2.0] and before.step_span_ms == [1.1, 1.1]
    assert [(t.role, t.path, t.exists) for t in after.traces] == [
        ("trace", str(tmp_path / "after.trace.json"), True), ("capture", str(tmp_path / "gone.json"), False)]


def test_the_verdict_carries_tokens_per_s_against_the_noise(tmp_path):
    rep = _pair(tmp_path)
    assert rep.verdict.startswith("bottleneck moved: attention 80.0% -> 33.3%")
    # the after profile was timed once: beyond 5% it is called, with the spread unknown said
    assert rep.throughput_verdict.startswith("tokens/s 8000.00 -> 20000.00, ms/step 1.00 -> 0.40: 2.50x, faster")
    assert "spread unknown: after timed once" in rep.throughput_verdict


def test_the_page_shows_what_moved_the_spread_and_the_raw_traces(tmp_path):
    rep = _pair(tmp_path)
    page = render_html(rep)
    assert "What moved most" in page and "-800.0 µs" in page and "100.0 µs" in page
    assert "1.00 (0.98-1.25, 3 windows)" in page and "0.40 (spread unknown" not in page  # no windows: no claim
    assert (tmp_path / "after.trace.json").as_uri() in page and "not on this machine" in page
    assert "Per-step timeline" in page
    text, files = render_markdown(rep, chart_dir=tmp_path, stem="r")
    assert "## What moved most" in text and "## Raw traces" in text and "## Per-step timeline" in text
    assert {p.name for p in files} == {"r-time.png", "r-categories.png", "r-steps.png"}


def test_a_profile_without_steps_is_shown_over_the_whole_profile():
    prof = make_profile([("k", "attention", 3, 3000.0)])
    prof.steps = None
    rep = build_report(["p.json"], [prof])
    assert rep.facts[0].per_step is False and rep.facts[0].category_ms == {"attention": 3.0}
    assert "over the whole profile" in render_html(rep)
