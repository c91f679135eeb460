"""The new figures in a profile: saved and loaded whole, per rank, and side by side in compare."""

import gzip
import json

import pytest

from dsv4opt.analysis import analyze_paths, compare_profiles
from dsv4opt.analysis.profile import Profile
from tests.helpers import SHARED_TRACES

K = {"ph": "X", "cat": "kernel", "pid": 0}


def _trace(tmp_path, name, kernels, steps=()):
    events = [dict(K, **k) for k in kernels]
    events += [{"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{i}", "pid": 0, "tid": 7, "ts": s, "dur": d}
               for i, (s, d) in enumerate(steps)]
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return path


# Stream 7 computes [0, 10] and [12, 20]; stream 9 communicates [5, 15] (as in test_timeline.py).
OVERLAPPED = [{"name": "sm90_xmma_gemm_bf16", "tid": 7, "ts": 0.0, "dur": 10.0}, {"name": "sm90_xmma_gemm_bf16", "tid": 7, "ts": 12.0, "dur": 8.0},
              {"name": "ncclDevKernel_AllReduce", "tid": 9, "ts": 5.0, "dur": 10.0}]
# The same work with the communication after the compute, nothing overlapping.
SERIAL = [{"name": "sm90_xmma_gemm_bf16", "tid": 7, "ts": 0.0, "dur": 10.0}, {"name": "sm90_xmma_gemm_bf16", "tid": 7, "ts": 10.0, "dur": 8.0},
          {"name": "ncclDevKernel_AllReduce", "tid": 9, "ts": 18.0, "dur": 10.0}]


def test_compare_sets_busy_idle_and_exposure_side_by_side(tmp_path):
    a = analyze_paths([_trace(tmp_path, "a.json", SERIAL)])
    b = analyze_paths([_trace(tmp_path, "b.json", OVERLAPPED)])
    tl = compare_profiles(a, b).timeline
    # by hand: serial: span 28, busy 28, no overlap; overlapped: span 20, busy 20, overlap 8
    assert (tl["kernel_us"]["a"], tl["kernel_us"]["b"]) == (28.0, 28.0)  # the plain sums cannot tell
    assert (tl["busy_us"]["a"], tl["busy_us"]["b"], tl["overlap_us"]["a"], tl["overlap_us"]["b"]) == (28.0, 20.0, 0.0, 8.0)
    comm = next(c for c in tl["categories"] if c["category"] == "communication")
    assert (comm["exposed_us_a"], comm["exposed_us_b"], comm["overlapped_us_b"]) == (10.0, 2.0, 8.0)
    assert compare_profiles(a, b).to_dict()["timeline"] == tl


def test_steps_carry_busy_idle_overlap(tmp_path):
    kernels = OVERLAPPED + [dict(k, ts=k["ts"] + 100.0) for k in SERIAL]
    p = analyze_paths([_trace(tmp_path, "t.json", kernels, steps=[(0.0, 50.0), (100.0, 50.0)])])
    rows = p.steps["steps"]
    assert [(r["busy_us"], r["idle_us"], r["overlap_us"]) for r in rows] == [(20.0, 0.0, 8.0), (28.0, 0.0, 0.0)]
    assert (p.steps["busy_us_per_step"], p.steps["overlap_us_per_step"]) == (24.0, 4.0)


def test_several_ranks_keep_their_rows(tmp_path):
    for rank, kernels in ((0, OVERLAPPED), (1, SERIAL)):
        (tmp_path / f"9-TP-{rank}-DECODE.trace.json.gz").write_bytes(
            gzip.compress(json.dumps({"traceEvents": [dict(K, **k) for k in kernels]}).encode()))
    p = analyze_paths([tmp_path])
    assert sorted((d.rank, d.busy_us, d.overlap_us) for d in p.timeline.devices) == [(0, 20.0, 8.0), (1, 28.0, 0.0)]


def test_cpu_only_profile_has_no_timeline(tmp_path):
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 4}]
    (tmp_path / "cpu.json").write_text(json.dumps({"traceEvents": ops}))
    p = analyze_paths([tmp_path / "cpu.json"])
    assert p.timeline is None and p.kernels[0].efficiency is None and p.kernels[0].p90_us is None


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces absent")
def test_new_figures_survive_save_and_load(tmp_path):
    p = analyze_paths([SHARED_TRACES / "tracelens_h100_qwen1.5_0.5b.json.gz"])
    assert p.timeline and p.peak and p.kernels[0].efficiency and p.kernels[0].p90_us is not None
    again = Profile.load(p.save(tmp_path / "p.json"))
    assert again == p
