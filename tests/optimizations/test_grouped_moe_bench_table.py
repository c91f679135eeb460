"""The grouped-moe bench's pieces that need no GPU: the floor's bytes and expected experts counted
independently, the input routing of each layout, the anchor's optional import, and the table at 80
columns with every figure whole."""

from __future__ import annotations

import math

import pytest
import torch
from rich.console import Console

from dsv4opt.optimizations.grouped_moe import anchor, bench
from dsv4opt.optimizations.registry import CheckResult


def test_expert_bytes_count_values_and_e8m0_scales():
    # dp-ep: (2 * 2048 * 4096 + 4096 * 2048) values, half a byte each, one scale byte per 32
    assert bench.LAYOUTS["dp-ep"].expert_bytes(4096) == 12_582_912 + 786_432
    assert bench.LAYOUTS["tp4"].expert_bytes(4096) == (3 * 512 * 4096) // 2 + (3 * 512 * 4096) // 32


def test_expected_experts_match_a_count_over_random_routings():
    gen = torch.Generator().manual_seed(0)
    for name in ("tp4", "dp-ep"):
        lay = bench.LAYOUTS[name]
        for c in (1, 16):
            hits = [bench.floor_bytes(lay, bench.routing(lay, c, gen, "cpu")[0], 4096)[1] for _ in range(300)]
            mean = sum(hits) / len(hits)
            want = lay.expected_experts(c, 6, 256)
            assert math.isclose(mean, want, rel_tol=0.05), (name, c, mean, want)


def test_routing_of_each_layout():
    gen = torch.Generator().manual_seed(1)
    ids, gates = bench.routing(bench.LAYOUTS["tp4"], 5, gen, "cpu")
    assert ids.shape == (5, 6) and (ids >= 0).all() and all(len(set(r)) == 6 for r in ids.tolist())
    ids, gates = bench.routing(bench.LAYOUTS["dp-ep"], 5, gen, "cpu")
    assert ids.shape == (40, 6) and (ids[:5] >= 0).all() and (ids[5:] == -1).all() and ids.max() < 32
    assert torch.allclose(gates.sum(1), torch.ones(40))


def test_floor_bytes_count_rows_read_and_written():
    lay = bench.LAYOUTS["dp-ep"]
    ids = torch.full((16, 6), -1, dtype=torch.int32)
    ids[0] = torch.tensor([0, 1, 1, 2, 3, 3])
    moved, hit = bench.floor_bytes(lay, ids, 4096)
    assert hit == 4 and moved == 4 * lay.expert_bytes(4096) + (1 + 16) * 4096 * 2


def test_anchor_is_optional():
    assert isinstance(anchor.available(), bool)


def test_the_table_fits_80_columns_and_keeps_every_figure():
    check = CheckResult(name="grouped-moe", passed=True, device="NVIDIA H200", figures={}, bounds={},
                        summary="25/25 cases within rel 0.01 in bfloat16 on cuda; worst rel err 2.70e-03 (M8-mixed)",
                        details={"cases": []})
    rows = [bench.BenchRow(layout="dp-ep", concurrency=64, tokens=512, sets=4, experts_hit=32.0, floor_us=100.2,
                           grouped_us=1234.5, frac_floor=0.081, anchor_us=9999.9, anchor_gemm_us=195.1,
                           anchor_frac_floor=0.51, speedup_vs_anchor=0.16, baseline_us=177610.3,
                           speedup_vs_baseline=144.0),
            bench.BenchRow(layout="tp4", concurrency=1, tokens=1, sets=8, experts_hit=6.0, floor_us=4.7,
                           grouped_us=15.5, frac_floor=0.30)]
    result = bench.BenchResult(check, "NVIDIA H200", 4271.0, "triton_kernels", {"tp4 C=1": 2e-3}, rows)
    console = Console(record=True, width=80)
    console.print(bench.render(result))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    table = text[: text.index("hit: local")]
    assert "…" not in table, table
    for r in rows:
        line = next(ln for ln in table.splitlines() if ln.split()[:2] == [r.layout, str(r.concurrency)])
        assert f"{r.grouped_us:.1f}" in line and f"{r.floor_us:.1f}" in line, line
    assert "9999.9" in table and "144" in table
    assert "51%" in next(ln for ln in table.splitlines() if ln.split()[:2] == ["dp-ep", "64"])  # 100.2 / 195.1


def test_json_holds_no_nan():
    import json

    check = CheckResult(name="grouped-moe", passed=True, device="x", figures={}, bounds={}, summary="", details={})
    result = bench.BenchResult(check, "x", 1.0, "triton_kernels", {"tp4 C=1": float("inf")},
                               [bench.BenchRow("tp4", 1, 1, 2, 6.0, 4.7, float("nan"), float("nan"))])
    text = json.dumps(result.as_json(), allow_nan=False)
    assert '"grouped_us": null' in text and '"tp4 C=1": null' in text


def test_a_narrowed_sweep_times_the_matching_candidates_beside_the_table():
    from dsv4opt.workload.kernels.grouped_moe import configs

    shape = (32, 2048, 4096, 48 * 32)  # dp-ep at C = 32: the ws candidates are offered
    cands = configs.candidates(*shape)
    table = configs.choose(*shape)
    picked = bench.swept(cands, table, r"up 64x128w4s4k1c2ws ")  # the ws gate/up on 4 stages
    assert picked[0] == table and len(picked) == 2
    assert picked[1].up.ws and picked[1].up.stages == 4 and picked[1] != table
    assert bench.swept(cands, table, None) == cands
    assert bench.swept(cands, table, "no config is named this") == [table]


def test_a_bad_match_is_one_line_and_exits_nonzero():
    with pytest.raises(SystemExit) as exc:
        bench.main(["--sweep", "--match", "("])
    assert "--match is not a regular expression" in str(exc.value.code)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--match", "ws"])
    assert "give --sweep too" in str(exc.value.code)
