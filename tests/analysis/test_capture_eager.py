"""Graph-replayed kernels mapped back to operators and model parts through an eager reference run.

The fixtures are one real H200 run of the embedded workload: 2 graph-replayed decode steps, and the
one eager step profiled before capture. Expected values come from plain json parsing of the files.
"""

import gzip
import json
from collections import Counter

import numpy as np
import pytest

from dsv4opt.analysis import analyze_paths
from dsv4opt.analysis.attribute import align_names, launch_info, match_capture
from dsv4opt.analysis.parts import NO_PART, UNMATCHED_REPLAY, kernel_parts, with_replayed_parts
from dsv4opt.trace import read_trace
from tests.helpers import DATA

GRAPH = DATA / "h200-dsv4flash-l3-c4-graph.trace.json.gz"
EAGER = DATA / "h200-dsv4flash-l3-c4-eager.trace.json.gz"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _events(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _write(path, events):
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def _gpu_events(events):
    """GPU events in start order."""
    return sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS), key=lambda e: e["ts"])


def _reference_parts(events):
    """Part of each GPU event of the eager run (start order): innermost gpu_user_annotation around its start."""
    ranges = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                     if e.get("cat") == "gpu_user_annotation" and not e["name"].startswith("ProfilerStep#")))
    out = []
    for k in _gpu_events(events):
        inside = [r for r in ranges if r[0] <= k["ts"] <= r[1]]
        out.append(inside[-1][2] if inside else NO_PART)
    return out


def _replay_steps(events):
    """GPU events of each graph launch (correlation id), in start order."""
    by_corr = {}
    for e in _gpu_events(events):
        by_corr.setdefault(e["args"]["correlation"], []).append(e)
    return list(by_corr.values())


@pytest.fixture(scope="module")
def eager_events():
    return _events(EAGER)


@pytest.fixture(scope="module")
def graph_events():
    return _events(GRAPH)


@pytest.fixture(scope="module")
def profile():
    return analyze_paths([GRAPH], capture=EAGER)


def test_every_replayed_event_is_counted_and_nearly_all_match(profile, graph_events):
    replayed = len(_gpu_events(graph_events))
    assert profile.capture_match.replayed == replayed
    assert profile.capture_match.matched >= 0.95 * replayed


def test_replay_parts_are_the_reference_parts_once_per_step(profile, eager_events, graph_events):
    ref = Counter(_reference_parts(eager_events))
    steps = len(_replay_steps(graph_events))
    unmatched = profile.capture_match.replayed - profile.capture_match.matched
    got = {r.part: r for r in profile.parts}
    assert set(got) - {UNMATCHED_REPLAY} == set(ref)
    for part, n in ref.items():
        assert abs(got[part].count - n * steps) <= unmatched, part
    total = sum(e["dur"] for e in _gpu_events(graph_events))
    assert sum(r.total_us for r in profile.parts) == pytest.approx(total, rel=1e-9)


def test_large_parts_take_about_the_reference_time_per_step(profile, eager_events, graph_events):
    # Graph replay changes launch gaps, not kernel work: big parts keep their GPU time within 25%.
    ref_us = Counter()
    for e, part in zip(_gpu_events(eager_events), _reference_parts(eager_events)):
        ref_us[part] += e["dur"]
    steps = len(_replay_steps(graph_events))
    big = [p for p, us in ref_us.items() if us >= 0.05 * sum(ref_us.values())]
    assert big
    got = {r.part: r.total_us for r in profile.parts}
    for part in big:
        assert got[part] == pytest.approx(ref_us[part] * steps, rel=0.25), part


def test_each_replayed_kernel_gets_the_part_of_its_place_in_the_eager_step(eager_events, graph_events):
    ref_names = [e["name"] for e in _gpu_events(eager_events)]
    replay_steps = _replay_steps(graph_events)
    # On these fixtures graph and eager ran the same sequence, so the k-th replayed event of a step is
    # the k-th eager event: an expectation that needs no alignment.
    assert all([e["name"] for e in step] == ref_names for step in replay_steps)
    expected_by_ts = {e["ts"]: part for step in replay_steps for e, part in zip(step, _reference_parts(eager_events))}

    graph, eager = read_trace(GRAPH), read_trace(EAGER)
    la = launch_info(graph)
    captured = match_capture(graph.kernels, la, eager)
    ela = launch_info(eager)
    ref_parts = kernel_parts(eager.kernels["ts_us"].to_numpy(), ela["launch_ts_us"].to_numpy(),
                             ela["launch_tid"].to_numpy(), eager.annotations)
    part = with_replayed_parts(None, la["via_graph"].to_numpy(), captured["cap_kernel"].to_numpy(), ref_parts)
    # The reader keeps microsecond times; match events by start order within the trace instead of raw ts.
    order = np.argsort(graph.kernels["ts_us"].to_numpy(), kind="mergesort")
    expected = [expected_by_ts[ts] for ts in sorted(expected_by_ts)]
    assert list(part[order]) == expected


def test_grouped_gemm_is_moe_and_launched_by_scaled_grouped_mm(profile, eager_events):
    ops = {e["args"]["External id"]: e["name"] for e in sorted((e for e in eager_events if e.get("cat") == "cpu_op"),
                                                                key=lambda e: -e["dur"])}
    runtime = {e["args"]["correlation"]: e for e in eager_events
               if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    grouped = {e["name"] for e in eager_events if e.get("cat") == "kernel" and "device_kernel" in e["name"]
               and ops.get(runtime.get(e["args"]["correlation"], {}).get("args", {}).get("External id")) == "aten::_scaled_grouped_mm"}
    assert grouped
    parts_of = {part for e, part in zip(_gpu_events(eager_events), _reference_parts(eager_events)) if e["name"] in grouped}
    assert parts_of == {"moe"}
    rows = [k for k in profile.kernels if k.name in grouped]
    assert rows and all(k.launched_by == "aten::_scaled_grouped_mm" for k in rows)


def test_kernels_missing_from_the_reference_stay_unmatched(tmp_path, eager_events, graph_events):
    # Rename the eager run's MoE kernels: their replayed twins must not borrow another kernel's part,
    # and the rest must still align across the gap.
    parts = _reference_parts(eager_events)
    moe = {id(e) for e, part in zip(_gpu_events(eager_events), parts) if part == "moe"}
    edited = [dict(e, name=f"renamed_{i}") if id(e) in moe else e for i, e in enumerate(eager_events)]
    prof = analyze_paths([GRAPH], capture=_write(tmp_path / "eager.json.gz", edited))
    steps = len(_replay_steps(graph_events))
    got = {r.part: r.count for r in prof.parts}
    assert "moe" not in got
    assert got[UNMATCHED_REPLAY] == len(moe) * steps
    assert prof.capture_match.matched == (len(parts) - len(moe)) * steps
    for part, n in Counter(p for p in parts if p != "moe").items():
        assert got[part] == n * steps, part


def test_an_unrelated_reference_matches_nothing(tmp_path, eager_events):
    edited = [dict(e, name=f"other_{i}") if e.get("cat") in GPU_CATS else e for i, e in enumerate(eager_events)]
    prof = analyze_paths([GRAPH], capture=_write(tmp_path / "eager.json.gz", edited))
    assert prof.capture_match.matched == 0
    assert [r.part for r in prof.parts] == [UNMATCHED_REPLAY]
    attributed = [k for k in prof.kernels if k.launched_by is not None]
    assert attributed and all("graph replay" in k.launched_by for k in attributed)


@pytest.mark.parametrize("a, b, pairs", [
    (list("abcd"), list("abcd"), [(0, 0), (1, 1), (2, 2), (3, 3)]),
    (list("axbcd"), list("abcd"), [(0, 0), (2, 1), (3, 2), (4, 3)]),
    (list("abd"), list("abcd"), [(0, 0), (1, 1), (2, 3)]),
    (list(""), list("ab"), []),
    (list("ab"), list("cd"), []),
], ids=["same", "extra-in-replay", "missing-in-replay", "empty", "disjoint"])
def test_align_names_pairs_equal_names_in_order(a, b, pairs):
    ia, ib = align_names(a, b)
    assert list(zip(ia.tolist(), ib.tolist())) == pairs


def test_align_names_gives_up_rather_than_pair_a_scrambled_sequence():
    rng = np.random.default_rng(0)
    b = rng.integers(0, 20, 400).tolist()
    a = rng.permutation(b).tolist()
    ia, ib = align_names(a, b)
    assert ia.size == 0 and ib.size == 0
