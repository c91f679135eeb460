"""The fuse-glue bench table at 80 columns, from the committed H200 run: region names whole."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from dsv4opt.optimizations.fuse_glue.bench import BenchResult, BenchRow, render
from dsv4opt.optimizations.registry import CheckResult

RUN = Path(__file__).resolve().parents[2] / "evidence/h200/optimizations/fuse_glue_h200_bench.json"


def test_region_names_stay_whole_at_80_columns():
    data = json.loads(RUN.read_text())
    rows = [BenchRow(**{k: v for k, v in r.items() if k != "speedup"}) for r in data["rows"]]
    check = CheckResult(**data["check"])
    console = Console(record=True, width=80)
    console.print(render(BenchResult(check, data["device"], data["copy_gbps"], rows)))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    table = text[:text.index("C = 1: one layer")]
    assert "…" not in table
    for region in {r.region for r in rows}:
        assert f" {region} " in table, region
    # the per-layer sums, added up here from the run's rows: the split twice a layer, the rest once
    saved = sum((2 if r.region == "hc_split_sum" else 1) * (r.eager_us - r.fused_us) for r in rows if r.concurrency == 1)
    assert f"saves {saved:.1f} µs" in text and f"x43: {saved * 43 / 1e3:.2f} ms" in text
