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


def _c4_baseline(tokens_per_s: float, windows: list[float]):
    ms = sorted(windows)[1]
    return make_profile([("k", "attention", 10, 100.0)], meta={"concurrency": 4, "optimizations": []},
                        throughput={"tokens_per_s": tokens_per_s, "ms_per_step": ms, "ms_per_step_windows": windows})


def _two_runs():
    """Two `profile -c 4` runs at the same settings, the second 1.28x the first in tokens/s."""
    first = _c4_baseline(4000.0 / 1.28, [1.27, 1.28, 1.29])
    second = _c4_baseline(4000.0 / 1.0, [0.99, 1.0, 1.01])
    return build_report(["runs/a.json", "runs/b.json"], [first, second])


def test_the_speedup_column_says_what_the_verdict_says():
    """The column once read 0.78x and 1.00x (over the last baseline) beside a verdict of 1.28x."""
    rep = _two_runs()
    assert "1.28x, faster" in rep.throughput_verdict
    speedups = {name: row.speedup for row, name in zip(rep.sweep_rows, rep.sweep_names)}
    a, b = rep.names
    assert speedups[a] == 1.0 and round(speedups[b], 2) == 1.28
    assert rep.sweep_over == [a, a]
    text, _ = render_markdown(rep)
    assert f"| 4 | {b} | 4000.00 | 1.00 | 100.0% | attention | 1.28x | {a} |" in text


def test_two_runs_of_the_same_settings_get_names_that_differ_and_the_page_names_its_files():
    rep = _two_runs()
    assert rep.names == ["C=4 baseline (a.json)", "C=4 baseline (b.json)"]
    text, _ = render_markdown(rep)
    assert "| C=4 baseline (a.json) | - | - | runs/a.json |" in text and "| C=4 baseline (b.json) | - | - | runs/b.json |" in text
    assert "What moved most: C=4 baseline (a.json) -> C=4 baseline (b.json)" in text
    same = build_report(["p.json", "p.json"], [story_after_attention(), story_after_attention()])
    assert len(set(same.names)) == 2


def test_figures_are_right_aligned_and_their_units_in_the_headers():
    prof = story_after_attention()
    prof.throughput = {"tokens_per_s": 1600.0, "ms_per_step": 20.0}
    rep = build_report(["after.json"], [prof])
    text, _ = render_markdown(rep)
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| profile | attention (ms/step)"))
    assert "| kernel sum (ms/step) | measured ms/step |" in lines[head]
    assert lines[head + 1] == "|---|" + "---:|" * (lines[head].count("|") - 2)  # every column but the name
    kernels = next(line for line in lines if line.startswith("| # | share |"))
    assert kernels.startswith("| # | share | ms/step | launches/step |")
    page = render_html(rep)
    assert "<td class='n'>19.2%</td>" in page and "td.n,th.n{text-align:right" in page
    assert "<td class='n'>FP32 SIMT GEMM</td>" not in page


def test_a_29x_change_keeps_its_values_on_the_bars_and_the_axes_start_at_0():
    from dsv4opt.analysis.sweep import SweepRow
    from dsv4opt.report.plots import category_time_figure, throughput_figure

    fig = category_time_figure(["before", "after"], [{"moe": 3811.5, "attention": 95.1}, {"moe": 39.2, "attention": 95.0}],
                               [3909.1, 135.0], "ms per step")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["3907", "134"]  # each bar's total, by hand
    assert ax.get_ylim()[0] == 0
    rows = [SweepRow(c, v, "p.json", tps, None, 0.0, None, None)
            for c, v, tps in [(1, "baseline", 6.8), (32, "baseline", 8.2), (1, "all", 42.1), (32, "all", 544.3)]]
    fig = throughput_figure(rows)
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == 0  # 6.8 -> 8.2 tokens/s is not a cliff
    fig.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1  # beside the data, not over it


def test_a_report_of_two_sglang_paths_says_so_and_labels_each_profile():
    """`report` of the sm_120 and the Hopper C = 32 profiles once labelled both "C=32 baseline (file)" and
    took the Hopper baseline's speed-up over the sm_120 one."""
    from pathlib import Path

    from dsv4opt.analysis.profile import Profile

    root = Path(__file__).resolve().parents[2] / "evidence" / "h200" / "profiles"
    paths = [root / "layouts/campaign/embedded-dsv4-flash-c32-baseline-20261204-112517.json",
             root / "layouts/campaign/embedded-dsv4-flash-c32-mma-attn-20261204-112721.json",
             root / "hopper-0.5.23/embedded-dsv4-flash-c32-baseline-20261204-033223.json"]
    profiles = [Profile.load(p) for p in paths]
    rep = build_report([str(p) for p in paths], profiles)
    assert rep.names == ["C=32 baseline, SGLang 0.5.14 sm_120, tp4", "C=32 mma-attn, SGLang 0.5.14 sm_120, tp4",
                         "C=32 baseline, SGLang 0.5.23 Hopper (sm_90), tp4, stand-in kernels (SGLang's in attn)"]
    assert rep.mixed_paths.startswith("these profiles ran different SGLang paths (SGLang 0.5.14 sm_120: 2 profiles; "
                                      "SGLang 0.5.23 Hopper (sm_90) (stand-in kernels (SGLang's in attn)): 1 profile)")
    assert rep.verdict == "first and last profile not compared: run under different settings (sglang: 0.5.14 -> 0.5.23)"
    # each speed-up is over the first profile of its own path at its C
    tps = [p.throughput["tokens_per_s"] for p in profiles]
    by_name = {n: (r.speedup, over) for r, n, over in zip(rep.sweep_rows, rep.sweep_names, rep.sweep_over)}
    assert by_name[rep.names[2]] == (1.0, rep.names[2])
    assert by_name[rep.names[1]][1] == rep.names[0] and abs(by_name[rep.names[1]][0] - tps[1] / tps[0]) < 1e-9
    text, _ = render_markdown(rep)
    assert "| profile | SGLang path | layout | file |\n|---|---|---|---|" in text
    assert f"| {rep.names[2]} | 0.5.23 Hopper (sm_90) | tp4 | {paths[2]} |" in text
    assert f"**{rep.mixed_paths}**" in text
    evidence = text.split("## Evidence")[1]
    assert "| profile | basis | SGLang path | layout |" in evidence and "| GPU time | 0.5.14 sm_120 | tp4 |" in evidence
    page = render_html(rep)
    assert "<th>SGLang path</th>" in page and "these profiles ran different SGLang paths" in page


def test_one_path_is_not_said():
    rep = _two_runs()
    assert rep.mixed_paths is None


def test_one_path_with_different_kernels_is_said():
    """Two Hopper-path baselines, one on SGLang's own kernels and one on our stand-ins: named apart
    and said to differ in kernels, not in path."""
    from dsv4opt.analysis.profile import Profile
    from tests.helpers import REPO

    path = REPO / "evidence/h200/profiles/hopper-0.5.23/embedded-dsv4-flash-c32-baseline-20261204-033223.json"
    real, ours = Profile.load(path), Profile.load(path)
    real.meta["kernels"] = {"moe": "SGLang 0.5.23: Marlin moe_wna16_marlin_gemm", "qkv": "SGLang 0.5.23: DeepGEMM fp8_gemm_nt"}
    ours.meta["kernels"] = {"moe": "stand-in: Triton grouped MXFP4 MoE (for Marlin moe_wna16_marlin_gemm)",
                            "qkv": "SGLang 0.5.23: DeepGEMM fp8_gemm_nt"}
    rep = build_report([str(path), str(path)], [real, ours])
    assert rep.names[0].endswith("tp4, SGLang's kernels") and rep.names[1].endswith("tp4, SGLang's kernels (stand-ins in moe)")
    assert rep.mixed_paths.startswith("these profiles ran different kernels on one SGLang path (SGLang 0.5.23 Hopper "
                                      "(sm_90) (SGLang's kernels): 1 profile; ")
