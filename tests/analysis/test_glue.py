"""Glue regions: the rules on hand-built launch sequences, and the real H200 trace of the faithful
workload (graph replay mapped through its eager reference) against figures read from the trace
files with plain json."""

from __future__ import annotations

import gzip
import json
import statistics

import numpy as np
import pandas as pd
import pytest

from dsv4opt.analysis import analyze_paths
import msgspec

from dsv4opt.analysis.glue import (
    BYTES, HANDWRITTEN, LAUNCH_FLOOR, REGION_COLUMNS, SEQ_COLUMNS, SINGLE, assign_regions, glue_summary, launch_floor_us,
)
from dsv4opt.analysis.profile import GlueRegions, Profile
from tests.helpers import DATA

GRAPH = DATA / "h200-dsv4flash-faithful-l4-c32-graph.trace.json.gz"
EAGER = DATA / "h200-dsv4flash-faithful-l4-c32-eager.trace.json.gz"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def seq(*rows: dict) -> pd.DataFrame:
    """Launches in stream order from short dicts; unspecified fields take neutral values."""
    base = {"stream": 0, "dur_us": 1.0, "step": 0, "part": None, "site": None, "op": None, "op_call": -1,
            "frame_call": -1, "handwritten": False, "bytes": np.nan}
    out = []
    for i, r in enumerate(rows):
        row = {**base, "ts_us": float(i), "name": f"k{i}", **r}
        out.append(row)
    return pd.DataFrame(out)[SEQ_COLUMNS]


G = {"category": "elementwise"}
H = {"category": "gemm_tc"}


def test_regions_break_at_heavy_kernels_parts_steps_and_streams():
    s = seq(H, {**G, "part": "a"}, {**G, "part": "a"}, {**G, "part": "b"}, H, G, {**G, "step": 1}, {**G, "stream": 1, "ts_us": 5.5})
    instance, inside = assign_regions(s)
    assert instance.tolist() == [-1, 0, 0, 1, -1, 2, 3, 4]
    assert not inside.any()


def test_glue_of_a_heavy_kernels_own_call_is_in_no_region():
    # an ATen GEMM and a reduction of the same operator call; a hand-written kernel and the fills
    # its Python wrapper makes around it
    s = seq(H | {"op_call": 7}, G | {"op_call": 7}, G | {"op_call": 8},
            G | {"op_call": 9, "frame_call": 3}, {"category": "attention", "frame_call": 3}, G | {"frame_call": 3},
            G | {"frame_call": 4}, H)
    instance, inside = assign_regions(s)
    assert inside.tolist() == [False, True, False, True, False, True, False, False]
    assert instance.tolist() == [-1, -1, 0, -1, -1, -1, 1, -1]


def test_a_run_of_the_heavy_call_ends_at_the_first_launch_of_another():
    s = seq(H | {"op_call": 7}, G | {"op_call": 8}, G | {"op_call": 7}, H | {"op_call": 9})
    instance, inside = assign_regions(s)
    assert not inside.any() and instance.tolist() == [-1, 0, 0, -1]


def test_estimates_floor_bytes_hand_written_and_single_launches():
    floor = 1.0
    s = seq(H, G | {"dur_us": 5.0, "bytes": 8e6, "site": "a.py:1 f"}, G | {"dur_us": 5.0, "bytes": 4e6, "site": "a.py:1 f"},
            H, G | {"dur_us": 3.0, "site": "b.py:1 g"}, G | {"dur_us": 2.5, "handwritten": True, "site": "b.py:2 h"},
            H, G | {"dur_us": 4.0, "site": "c.py:1 k"}, H, G | {"dur_us": 0.2, "site": "d.py:1 m"},
            G | {"dur_us": 0.3, "site": "d.py:1 m"}, H)
    s.loc[s["category"] == "gemm_tc", "dur_us"] = 0.5  # the floor is the median of the shortest 10%: 1 kernel
    s.loc[0, "dur_us"] = floor
    s.loc[[3, 6, 8, 11], "dur_us"] = 50.0
    summary = glue_summary(s, total_us=1000.0, steps=1, copy_gbps=1000.0)
    assert summary.launch_floor_us == launch_floor_us(s["dur_us"].to_numpy()) == 0.2
    by = {r.where: r for r in summary.regions}
    # 8 MB at 1000 GB/s = 8 µs (the largest operator's traffic); 10 µs now
    assert by["a.py:1 f"].fused_us_per_step == pytest.approx(8.0) and by["a.py:1 f"].estimate == BYTES
    assert by["b.py:1 g · b.py:2 h"].fused_us_per_step == pytest.approx(2.5)
    assert by["b.py:1 g · b.py:2 h"].estimate == HANDWRITTEN
    assert by["c.py:1 k"].saving_us_per_step == 0 and by["c.py:1 k"].estimate == SINGLE
    # never estimated above what it takes now: 0.5 µs of glue against a 0.2 µs floor ... and bytes unknown here
    assert by["d.py:1 m"].fused_us_per_step == pytest.approx(0.2)
    assert by["d.py:1 m"].bytes_per_step is None and by["d.py:1 m"].estimate == LAUNCH_FLOOR
    assert [r.saving_us_per_step for r in summary.regions] == sorted((r.saving_us_per_step for r in summary.regions), reverse=True)
    assert summary.saving_us_per_step == pytest.approx(sum(r.saving_us_per_step for r in summary.regions))


def test_same_code_in_every_layer_and_step_is_one_region():
    layer = [H, G | {"site": "m.py:3 act", "part": "moe"}, G | {"site": "m.py:3 act", "part": "moe"}, H]
    s = seq(*(r | {"step": step} for step in (0, 1) for _ in range(3) for r in layer))
    summary = glue_summary(s, total_us=100.0, steps=2)
    (region,) = summary.regions
    assert region.key == "moe | m.py:3 act"
    assert (region.instances_per_step, region.launches_per_step, region.launches_saved_per_step) == (3, 6, 3)
    assert region.gpu_us_per_step == pytest.approx(6.0) and region.share == pytest.approx(12.0 / 100.0)


def test_keys_fall_back_to_operators_then_kernel_names_and_say_so():
    by_ops = glue_summary(seq(H, G | {"op": "aten::mul"}, G | {"op": "aten::sum"}, H), 10.0, 1)
    assert by_ops.keyed_by == "operators" and by_ops.regions[0].where == "aten::mul · aten::sum"
    assert any("with_stack" in n for n in by_ops.notes)
    by_names = glue_summary(seq(H, G, G, H), 10.0, 1)
    assert by_names.keyed_by == "kernel names" and by_names.regions[0].where == "k1 · k2"
    assert any("--capture" in n for n in by_names.notes)
    assert any("record_shapes" in n for n in by_names.notes) and any("part" in n for n in by_names.notes)


def test_no_glue_keeps_the_schema():
    summary = glue_summary(seq(H, H), 10.0, 1)
    assert summary.regions == [] and summary.saving_us_per_step == 0
    assert msgspec.convert(json.loads(json.dumps(msgspec.to_builtins(summary))), GlueRegions) == summary
    from dsv4opt.analysis.glue import region_table

    empty = region_table(seq(H).iloc[:0], np.zeros(0, np.int64), 1, 1.0, 1.0, None)
    assert list(empty.columns) == REGION_COLUMNS and empty.empty


# ---- the real H200 trace ----------------------------------------------------------------------

def _gpu_events(path) -> list[dict]:
    events = json.load(gzip.open(path))["traceEvents"]
    return sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS), key=lambda e: e["ts"])


@pytest.fixture(scope="module")
def real():
    profile = analyze_paths([GRAPH], capture=EAGER)
    return profile, profile.glue


def test_real_trace_regions_match_plain_sums(real):
    profile, summary = real
    events = _gpu_events(GRAPH)
    names = [e["name"] for e in events]
    steps = 2
    gemv = [i for i, n in enumerate(names) if "_mxfp4_slot_gemv_kernel" in n]
    between = [e for a, b in zip(gemv[0::2], gemv[1::2]) for e in events[a + 1:b]]
    total = sum(e["dur"] for e in events)
    floor = statistics.median(sorted(e["dur"] for e in events)[: len(events) // 10])
    assert summary.steps == steps and summary.launch_floor_us == pytest.approx(floor)
    by = {r.where: r for r in summary.regions}
    act = by["model.py:400 routed_experts_sm120"]  # the SwiGLU between the two slot GEMVs
    assert act.part == "moe" and act.instances_per_step == 4
    assert act.launches_per_step == len(between) / steps == 32
    assert act.gpu_us_per_step == pytest.approx(sum(e["dur"] for e in between) / steps)
    assert act.share == pytest.approx(sum(e["dur"] for e in between) / total)
    assert act.fused_us_per_step == pytest.approx(4 * floor) and act.estimate == LAUNCH_FLOOR
    # the pre-mix split and sum: the Sinkhorn kernel is hand-written and kept
    sinkhorn = [e["dur"] for e in events if "_hc_split_sinkhorn_kernel" in e["name"]]
    hc = by["model.py:296 _hc_pre · mhc.py:77 hc_split_sinkhorn"]
    assert hc.instances_per_step == 8 and hc.launches_per_step == 40
    assert hc.fused_us_per_step == pytest.approx(sum(sinkhorn) / steps) and hc.estimate == HANDWRITTEN
    assert profile.glue.keyed_by == "source sites"


def test_real_trace_fills_of_the_attention_call_are_in_no_region(real):
    _, summary = real
    names = [e["name"] for e in _gpu_events(GRAPH)]
    fills = sum(1 for i, n in enumerate(names) if "FillFunctor" in n
                and any("_simt_sparse_decode_kernel" in m for m in names[i + 1:i + 3]))
    assert summary.in_heavy_calls["launches_per_step"] == fills / 2 == 12


def test_real_replay_without_its_reference_is_keyed_by_kernel_names():
    summary = analyze_paths([GRAPH]).glue
    assert summary.keyed_by == "kernel names" and summary.regions
    assert any("--capture" in n for n in summary.notes)


def test_glue_regions_survive_save_and_load(real, tmp_path):
    profile, summary = real
    path = profile.save(tmp_path / "p.json")
    assert Profile.load(path).glue == summary
