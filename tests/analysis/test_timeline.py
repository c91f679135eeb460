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


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces absent")
def test_whole_trace_busy_idle_overlap_beside_the_steps():
    """Holistic Trace Analysis' temporal breakdown covers the whole trace; the profile keeps that
    figure beside the per-step one (on this trace the step holds 70% of the busy time)."""
    from dsv4opt.analysis import analyze_paths
    from dsv4opt.analysis.busy import whole_trace

    path = SHARED_TRACES / "tracelens_h100_qwen1.5_0.5b.json.gz"
    gpu = gpu_events(path)
    prof = analyze_paths([path])
    per_device = defaultdict(lambda: defaultdict(list))
    origin = min(e["ts"] for e in gpu)  # epoch microseconds lose 1e-4 us in start + dur; times from the first do not
    for e in gpu:
        per_device[e["args"].get("device", e["pid"])][e["tid"]].append((e["ts"] - origin, e["ts"] - origin + e["dur"]))
    assert len(per_device) == 1
    streams = next(iter(per_device.values()))
    every = [iv for ivs in streams.values() for iv in ivs]
    (row,) = prof.timeline.whole
    span = max(e for _, e in every) - min(s for s, _ in every)
    assert math.isclose(row.busy_us, _union(every), rel_tol=1e-12)
    assert math.isclose(row.span_us, span, rel_tol=1e-12) and math.isclose(row.idle_us, span - _union(every), rel_tol=1e-9)
    assert math.isclose(row.overlap_us, _at_least_two(streams), rel_tol=1e-9, abs_tol=1e-9)
    w = whole_trace(prof.timeline)
    assert math.isclose(w.in_steps_busy_us, sum(d.busy_us for d in prof.timeline.devices), rel_tol=1e-12)
    assert w.in_steps_busy_us < 0.8 * w.busy_us  # this trace's kernels outside its step are counted here
    from rich.console import Console

    from dsv4opt.display import duration
    from dsv4opt.report.tables import print_profile

    console = Console(width=200, record=True)
    print_profile(prof, console=console)
    text = console.export_text()
    assert (f"whole trace, steps or not: span {duration(span)}, busy {duration(_union(every))}" in text
            and f"its step holds {duration(w.in_steps_busy_us)} of the busy time" in text)


def test_profiles_written_before_the_whole_trace_load_without_it():
    from dsv4opt.analysis.busy import whole_trace
    from dsv4opt.analysis.profile import Profile
    from tests.helpers import FIXTURE_PROFILES

    prof = Profile.load(FIXTURE_PROFILES / "fuse-glue" / "embedded-dsv4-flash-c32-ctx8192-mma-attn+bf16-gemm+grouped-moe.json")
    assert prof.timeline is not None and prof.timeline.whole == [] and whole_trace(prof.timeline) is None
