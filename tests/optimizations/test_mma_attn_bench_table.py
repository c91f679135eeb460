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

DOCS = Path(__file__).resolve().parents[2] / "docs/kernels"


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
