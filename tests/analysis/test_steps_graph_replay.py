"""Under CUDA-graph replay a step owns the kernels its CPU range launched (counted here by hand)."""

from __future__ import annotations

import gzip
import json
import statistics

import pytest

from dsv4opt.analysis import analyze_paths
from tests.helpers import DATA

GRAPH = DATA / "h200-dsv4flash-l3-c4-graph.trace.json.gz"
EAGER = DATA / "h200-dsv4flash-l3-c4-eager.trace.json.gz"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _by_hand(path):
    """Per CPU-side ProfilerStep range: GPU events whose launch (same correlation id) lies inside it."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
                   and e.get("cat") != "gpu_user_annotation")
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    per_step = []
    for start, end in steps:
        mine = [e for e in gpu if start <= launch_ts.get(e["args"].get("correlation"), -1) <= end]
        per_step.append((len(mine), sum(e["dur"] for e in mine)))
    return per_step


@pytest.mark.parametrize("path", [GRAPH, EAGER], ids=["graph-replay", "eager"])
def test_steps_follow_launches(path):
    expected = _by_hand(path)
    assert expected and all(n > 1000 for n, _ in expected), "fixture should hold whole decode steps"
    prof = analyze_paths([path])
    assert prof.steps["source"] == "ProfilerStep"
    assert prof.steps["count"] == len(expected)
    assert prof.steps["launches_per_step"] == pytest.approx(statistics.mean(n for n, _ in expected))
    assert prof.steps["gpu_us_per_step"] == pytest.approx(statistics.mean(t for _, t in expected))
