"""recommend says when a trace is not decode (training, prefill) instead of giving decode advice.
The real traces are third-party (../shared/traces, skipped when absent); the expected figures are
summed from the raw events here, not taken from the code under test."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict

import pytest
from typer.testing import CliRunner

from dsv4opt.analysis import analyze_paths
from dsv4opt.cli import app
from dsv4opt.decision.phase import not_decode
from dsv4opt.decision.recommend import recommend
from tests.decision.profiles import make_profile
from tests.helpers import SHARED_TRACES

GPU = ("kernel", "gpu_memcpy", "gpu_memset")


def _trace(name: str):
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip(f"no {name} in ../shared/traces")
    with gzip.open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return path, [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU]


def _share(events, keep) -> float:
    return sum(e["dur"] for e in events if keep(e)) / sum(e["dur"] for e in events)


@pytest.mark.parametrize("name", ["hta_a100_train_control.json.gz", "hta_v100_ns_resolution.json.gz"])
def test_a_training_trace_gets_no_decode_advice(name):
    path, events = _trace(name)
    backward = _share(events, lambda e: e["cat"] == "kernel" and re.search(r"backward|bwd|_bw_|dgrad|wgrad", e["name"], re.I))
    reduce = _share(events, lambda e: "ncclKernel_AllReduce" in e["name"])
    rec = recommend(analyze_paths([path]))
    assert rec.candidates == [] and rec.chosen is None and len(rec.explanation) == 1
    head = f"this trace looks like training (backward kernels {backward:.1%} of GPU time"
    assert rec.explanation[0].startswith(head + (f", NCCL all-reduce {reduce:.1%}" if reduce else ""))
    assert rec.explanation[0].endswith("dsv4opt's levers are for decode, so none is recommended; profile the decode "
                                       "steps (`dsv4opt profile`, or a trace of decode only)")
    r = CliRunner().invoke(app, ["recommend", str(path)], env={"COLUMNS": "300"})
    assert r.exit_code == 0 and head in r.output and "fp8-weights" not in r.output and "Levers" not in r.output


def test_the_a100_trace_names_its_gradient_all_reduce_and_optimizer():
    path, events = _trace("hta_a100_train_control.json.gz")
    assert any("AllReduce" in e["name"] for e in events) and any("adagrad" in e["name"] for e in events)
    line = recommend(analyze_paths([path])).explanation[0]
    assert "NCCL all-reduce" in line and "optimizer kernels (adagrad)" in line


def test_a_long_gemm_forward_looks_like_prefill():
    path, events = _trace("tracelens_torch_compile_triton.json.gz")
    kernels = [e for e in events if e["cat"] == "kernel"]
    by_name = defaultdict(list)
    for e in kernels:
        by_name[e["name"]].append(e["dur"])
    # the median launch, each launch at its kernel's mean duration
    points = sorted((sum(d) / len(d), len(d)) for d in by_name.values())
    half, seen = sum(n for _, n in points) / 2, 0
    for mean, n in points:
        seen += n
        if seen >= half:
            median = mean
            break
    gemm = _share(events, lambda e: e["name"].startswith("Cijk_"))  # hipBLASLt's GEMMs
    phase = not_decode(analyze_paths([path]))
    assert phase.kind == "prefill"
    assert phase.evidence == (f"median kernel {median:.0f} µs", f"GEMMs {gemm:.1%} of GPU time",
                              f"{len(kernels)} launches in the trace")


@pytest.mark.parametrize("name", ["tracelens_sglang_qwen3_8b_decode_mi300x.json.gz", "tracelens_h100_qwen1.5_0.5b.json.gz"])
def test_decode_traces_are_left_to_the_levers(name):
    path, _ = _trace(name)
    assert not_decode(analyze_paths([path])) is None


def test_an_extend_file_is_prefill_and_embedded_profiles_are_never_judged():
    rows = [("nvjet_sm90_tst_64x8", "gemm_tc", 10, 300.0), ("elementwise_kernel", "elementwise", 100, 700.0)]
    prof = make_profile(rows, meta={"target": "sglang", "sources": ["traces/1765-TP-0-EXTEND.trace.json.gz"]})
    assert not_decode(prof).evidence == ("1765-TP-0-EXTEND.trace.json.gz in its names",)
    backward = [("flash_bwd_dq_dk_dv_loop_kernel", "attention", 10, 900.0), ("elementwise_kernel", "elementwise", 10, 100.0)]
    assert not_decode(make_profile(backward, meta={"target": "trace"})).kind == "training"
    assert not_decode(make_profile(backward, meta={"target": "embedded"})) is None
