"""Report renderers: empty input, one profile, a sweep; HTML must need no network."""

from __future__ import annotations

import re

from dsv4opt.loop.report_facts import build_report
from dsv4opt.report.page import charts, render_html, render_markdown
from dsv4opt.report.plots import category_bars_png, throughput_chart_png
from tests.decision.profiles import make_profile, story_after_attention

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_empty_report_renders():
    rep = build_report([], [])
    assert "No profiles given" in render_html(rep)
    text, files = render_markdown(rep)
    assert "No profiles given" in text and files == {}


def test_empty_profile_renders():
    rep = build_report(["empty.json"], [make_profile([])])
    page = render_html(rep)
    assert "<table>" in page
    text, _ = render_markdown(rep)
    assert "## Evidence" in text


def test_single_profile_html_is_self_contained(tmp_path):
    prof = story_after_attention()
    rep = build_report(["after.json"], [prof])
    page = render_html(rep)
    # charts are inlined; nothing is fetched from elsewhere
    assert "data:image/png;base64," in page
    assert not re.search(r"""(src|href)=['"]https?://""", page)
    assert "FP32 SIMT GEMM" in page and "19.2%" in page
    assert "bf16-gemm" in page  # the recommendation names the next step


def test_markdown_writes_charts_beside_it(tmp_path):
    rep = build_report(["after.json"], [story_after_attention()])
    text, files = render_markdown(rep, chart_dir=tmp_path, stem="walk")
    assert "![category shares](walk-categories.png)" in text and "![time per step by category](walk-time.png)" in text
    assert set(files) == {tmp_path / "walk-categories.png", tmp_path / "walk-time.png"}
    assert all(data.startswith(PNG_MAGIC) for data in files.values())


def test_sweep_rows_and_speedup_from_profiles():
    profs, paths = [], []
    for c, base_tps, opt_tps in [(1, 10.0, 20.0), (16, 100.0, 250.0)]:
        for opts, tps in [([], base_tps), (["mma-attn"], opt_tps)]:
            p = make_profile([("k", "attention", 1, 1.0)], meta={"concurrency": c, "optimizations": opts},
                             throughput={"tokens_per_s": tps, "ms_per_step": 1000.0 * c / tps})
            profs.append(p)
            paths.append(f"c{c}-{'+'.join(opts) or 'baseline'}.json")
    rep = build_report(paths, profs)
    speedups = {(r.concurrency, r.variant): r.speedup for r in rep.sweep_rows}
    assert speedups[(1, "mma-attn")] == 2.0 and speedups[(16, "mma-attn")] == 2.5
    assert speedups[(1, "baseline")] == 1.0
    assert "throughput" in charts(rep)


def test_plots_return_png_or_none():
    assert category_bars_png([], []) is None
    assert throughput_chart_png([]) is None
    assert category_bars_png(["a"], [{"attention": 0.5, "copy": 0.5}]).startswith(PNG_MAGIC)
