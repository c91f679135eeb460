"""Busy/idle/overlap against hand-worked cases and plain-Python interval walks of a real trace."""

import math
from collections import defaultdict

import pandas as pd
import pytest

from dsv4opt.analysis.timeline import (CATEGORY_COLUMNS, DEVICE_COLUMNS, STREAM_COLUMNS, category_overlap, device_busy,
                                       stream_busy)
from tests.helpers import SHARED_TRACES, merged_intervals
from tests.trace.traces import gpu_events


def _events(rows):
    return pd.DataFrame(rows, columns=["step", "device", "stream", "category", "ts_us", "dur_us"])


# Stream 7 computes [0, 10], [12, 20] and, touching, [20, 25]; stream 9 communicates [5, 15]; a
# kernel outside any step (step -1) is left out; step 1 holds one kernel.
HAND = _events([
    (0, 0, 7, "gemm_tc", 0.0, 10.0), (0, 0, 9, "communication", 5.0, 10.0), (0, 0, 7, "gemm_tc", 12.0, 8.0),
    (0, 0, 7, "elementwise", 20.0, 5.0), (-1, 0, 7, "gemm_tc", 100.0, 50.0), (1, 0, 9, "communication", 200.0, 4.0),
])


def test_device_busy_idle_overlap_by_hand():
    d = device_busy(HAND).set_index("step")
    # step 0: span 0..25; busy = union = 25; sum 33; two streams together on [5, 10] and [12, 15]
    assert d.loc[0, ["span_us", "busy_us", "idle_us", "overlap_us", "kernel_us"]].tolist() == [25.0, 25.0, 0.0, 8.0, 33.0]
    assert d.loc[0, ["streams", "launches"]].tolist() == [2, 4]
    assert d.loc[1, ["span_us", "busy_us", "idle_us", "overlap_us"]].tolist() == [4.0, 4.0, 0.0, 0.0]


def test_stream_busy_by_hand():
    s = stream_busy(HAND).set_index(["step", "stream"])
    assert s.loc[(0, 7), ["busy_us", "idle_us", "launches"]].tolist() == [23.0, 2.0, 3]  # gap [10, 12]
    assert s.loc[(0, 9), ["busy_us", "idle_us"]].tolist() == [10.0, 15.0]


def test_category_exposure_by_hand():
    c = category_overlap(HAND).set_index(["step", "category"])
    # communication [5, 15]: alone only on [10, 12]; the GEMMs alone on [0, 5] and [15, 20]
    assert c.loc[(0, "communication"), ["busy_us", "exposed_us", "overlapped_us"]].tolist() == [10.0, 2.0, 8.0]
    assert c.loc[(0, "gemm_tc"), ["busy_us", "exposed_us", "overlapped_us"]].tolist() == [18.0, 10.0, 8.0]
    assert c.loc[(0, "elementwise"), ["busy_us", "exposed_us"]].tolist() == [5.0, 5.0]


def test_empty_input_keeps_the_schema():
    empty = _events([])
    assert list(device_busy(empty).columns) == DEVICE_COLUMNS
    assert list(stream_busy(empty).columns) == STREAM_COLUMNS
    assert list(category_overlap(empty).columns) == CATEGORY_COLUMNS
    assert device_busy(_events([(-1, 0, 1, "x", 0.0, 1.0)])).empty


def _union(intervals):
    return sum(e - s for s, e in merged_intervals(intervals))


def _at_least_two(per_stream):
    """Time covered by intervals of at least two different streams: each stream's merged ranges as
    +1/-1 edges, walked in time order (an end before a start at the same time)."""
    edges = sorted((t, d) for ivs in per_stream.values() for s, e in merged_intervals(ivs) for t, d in ((s, 1), (e, -1)))
    total, active, last = 0.0, 0, None
    for t, d in edges:
        if active >= 2:
            total += t - last
        active += d
        last = t
    return total


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces absent")
def test_real_trace_with_several_streams_against_plain_walks():
    gpu = gpu_events(SHARED_TRACES / "hta_a100_train_control.json.gz")
    per_stream = defaultdict(list)
    for e in gpu:
        per_stream[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    assert len(per_stream) >= 3
    ev = _events([(0, e["args"].get("device", e["pid"]), e["tid"], e["cat"], e["ts"], e["dur"]) for e in gpu])
    d = device_busy(ev).iloc[0]
    all_iv = [iv for ivs in per_stream.values() for iv in ivs]
    span = max(e for _, e in all_iv) - min(s for s, _ in all_iv)
    assert math.isclose(d["busy_us"], _union(all_iv), rel_tol=1e-12)
    assert math.isclose(d["span_us"], span, rel_tol=1e-12)
    assert math.isclose(d["idle_us"], span - _union(all_iv), rel_tol=1e-9)
    assert d["overlap_us"] > 0 and math.isclose(d["overlap_us"], _at_least_two(per_stream), rel_tol=1e-9)
    s = stream_busy(ev).set_index("stream")
    for tid, ivs in per_stream.items():
        assert math.isclose(s.loc[tid, "busy_us"], _union(ivs), rel_tol=1e-12)
