"""The mma-attn bench table at 80 columns, from the committed H200 runs: figures and units whole,
each row's main loop named, its launch configuration under the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from dsv4opt.optimizations.mma_attn.bench import BenchResult, BenchRow, render
from dsv4opt.optimizations.registry import CheckResult

DOCS = Path(__file__).resolve().parents[2] / "evidence/h200/kernels"


@pytest.mark.parametrize("kv", ["fp8", "bf16"])
def test_the_table_fits_80_columns_and_keeps_every_figure(kv):
    data = json.loads((DOCS / f"mma_attn_h200_bench_{kv}.json").read_text())
    rows = [BenchRow(**r) for r in data["rows"]]
    result = BenchResult(CheckResult(**data["check"]), data["device"], data["copy_gbps"], data["matmul_tflops"],
                         rows, kv)
    console = Console(record=True, width=80)
    console.print(render(result))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    table = text[:text.index("check:")]
    assert "…" not in table, table
    for r in rows:
        roofline = max(r.floor_us, r.flop_floor_us)
        line = next(ln for ln in table.splitlines() if ln.split()[:2] == [str(r.batch), r.tiles.split()[0]])
        assert f"{r.mma_us:.1f}" in line and f"{roofline / r.mma_us:.1%}" in line and f"{r.baseline_us:.1f}" in line, line
        assert f"B = {r.batch}: {r.tiles}" in " ".join(text.split()), r.tiles  # the configuration, whole


def test_pool_and_window_caches_have_the_benchs_geometry():
    """pool_cache: pool_gb of the compressed cache's pages in the asked layout, every page written;
    window_cache: one window page a request."""
    from dsv4opt.optimizations.mma_attn import bench

    gen = torch.Generator().manual_seed(0)
    for kv in ("fp8", "bf16"):
        pool = bench.pool_cache(kv, gen, pool_gb=2 / 1024, device="cpu")
        assert pool.layout.fp8 == (kv == "fp8") and pool.layout.page_size == bench.EXTRA_PAGE
        assert pool.data.numel() * pool.data.element_size() <= 2 * 2**20
        assert pool.tokens == (2 * 2**20) // (pool.layout.token_bytes * bench.EXTRA_PAGE) * bench.EXTRA_PAGE
        rows = pool.read(torch.arange(pool.tokens), torch.float32)
        assert rows.std(dim=1).min() > 0.5  # no row left unwritten (zeros)
        swa = bench.window_cache(kv, 3, gen, device="cpu")
        assert swa.tokens == 3 * bench.WINDOW_PAGE and swa.layout.page_size == bench.WINDOW_PAGE


def _graph_rows():
    """Rows shaped as graph_width_rows writes them; the figures are made up to exercise the layout
    (wide values in every column), not measurements."""
    from dsv4opt.optimizations.mma_attn.bench import GraphWidthRow, WINDOW

    rows = []
    for batch, (b128, b8192, m128, m8192) in {1: (78.4, 2275.2, 9.1, 9.6), 32: (493.0, 28215.4, 14.2, 15.3),
                                              64: (981.7, 56123.9, 20.4, 22.0)}.items():
        slots = batch * (64 + WINDOW)
        for width, base, mma in ((128, b128, m128), (8192, b8192, m8192)):
            rows.append(GraphWidthRow(batch, width, 64, "gluon-fp8-ws" if batch > 4 else "triton", base, mma,
                                      base * 1e3 / slots, mma * 1e3 / slots))
    return rows


def test_the_graph_width_table_fits_80_columns_and_compares_each_width_with_the_narrow_rows():
    from dsv4opt.optimizations.mma_attn.bench import render_graph_width

    rows = _graph_rows()
    console = Console(record=True, width=80)
    console.print(render_graph_width(rows, "fp8"))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "…" not in text, text
    for r in rows:
        narrow = next(n for n in rows if n.batch == r.batch and n.width == 128)
        line = next(ln for ln in text.splitlines() if ln.split()[:3] == [str(r.batch), str(r.width), r.main_loop])
        cells = line.split()
        assert cells[3:] == [f"{r.baseline_us:.1f}", f"{r.baseline_ns_per_slot:.2f}",
                             f"{r.baseline_us / narrow.baseline_us:.1f}", f"{r.mma_us:.1f}", f"{r.mma_ns_per_slot:.3f}",
                             f"{r.mma_us / narrow.mma_us:.2f}", f"{r.baseline_us / r.mma_us:.0f}"], line


def test_the_bench_prints_the_graph_width_table_under_the_main_one_only_when_it_ran():
    data = json.loads((DOCS / "mma_attn_h200_bench_fp8.json").read_text())
    rows = [BenchRow(**r) for r in data["rows"]]
    result = BenchResult(CheckResult(**data["check"]), data["device"], data["copy_gbps"], data["matmul_tflops"],
                         rows, "fp8")
    console = Console(record=True, width=80)
    console.print(render(result))
    assert "graph width" not in console.export_text()
    result.graph_rows = _graph_rows()
    console = Console(record=True, width=80)
    console.print(render(result))
    text = console.export_text()
    assert text.index("check:") < text.index("graph width: HCA-like rows")
    assert result.as_json()["graph_width"][0]["width"] == 128
