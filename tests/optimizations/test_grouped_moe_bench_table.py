"""The grouped-moe bench table at 80 columns, from the committed H200 run: every figure and header whole."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from dsv4opt.optimizations.grouped_moe.bench import BenchResult, BenchRow, render
from dsv4opt.optimizations.registry import CheckResult

RUN = Path(__file__).resolve().parents[2] / "docs/optimizations/grouped_moe_h200_bench.json"


def test_the_table_fits_80_columns_and_keeps_every_figure():
    data = json.loads(RUN.read_text())
    rows = [BenchRow(**r) for r in data["rows"]]
    console = Console(record=True, width=80)
    console.print(render(BenchResult(CheckResult(**data["check"]), data["device"], data["copy_gbps"], rows)))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    table = text[:text.index("check:")]
    assert "…" not in table and "baseline" in table, table
    for r in rows:
        line = next(ln for ln in table.splitlines() if ln.split()[:2] == [str(r.concurrency), str(r.tokens)])
        assert f"{r.grouped_us:.1f}" in line and f"{r.baseline_us:.1f}" in line and f"{r.speedup_vs_baseline:.1f}" in line
