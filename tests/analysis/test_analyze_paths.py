import gzip
import json
import math
from collections import Counter

import pytest

from dsv4opt.analysis import analyze_paths, compare_profiles
from dsv4opt.analysis.profile import CategoryRow, KernelRow, Profile
from dsv4opt.errors import DsvOptError
from tests.helpers import SHARED_TRACES
from tests.trace.traces import ids, plain_gpu_sums, real_traces

TRACES = real_traces()


@pytest.mark.skipif(not TRACES, reason="no real traces")
@pytest.mark.parametrize("path", TRACES, ids=ids(TRACES))
def test_profile_matches_plain_sums(path, tmp_path):
    total, per_name, counts = plain_gpu_sums(path)
    p = analyze_paths([path])
    assert p.total_us == total
    assert [k.total_us for k in p.kernels] == sorted((k.total_us for k in p.kernels), reverse=True)
    for k in p.kernels:
        assert k.count == counts[k.name]
        assert math.isclose(k.total_us, per_name[k.name], rel_tol=1e-12, abs_tol=1e-9)
    assert math.isclose(sum(c.share for c in p.categories), 1.0, rel_tol=1e-9)
    again = Profile.load(p.save(tmp_path / "p.json"))
    assert again.total_us == p.total_us and again.kernels == p.kernels and again.categories == p.categories


def _events(name):
    with gzip.open(SHARED_TRACES / name, "rt") as f:
        return json.load(f)["traceEvents"]


needs_shared = pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces absent")


@needs_shared
def test_steps_from_profiler_step_ranges():
    events = _events("hta_v100_ns_resolution.json.gz")
    expected = sum(1 for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    p = analyze_paths([SHARED_TRACES / "hta_v100_ns_resolution.json.gz"])
    assert p.steps["count"] == expected
    assert all(s["launches"] > 0 for s in p.steps["steps"])


@needs_shared
def test_attribution_follows_correlation_to_operator_and_stack():
    name = "tracelens_h100_qwen1.5_0.5b.json.gz"
    events = _events(name)
    p = analyze_paths([SHARED_TRACES / name])
    top = p.kernels[0]
    # Independently: kernel correlation -> runtime External id -> innermost cpu_op with that id.
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ops = {}
    for e in sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: -e["dur"]):
        ops[e["args"].get("External id")] = e["name"]
    votes = Counter()
    for e in events:
        if e.get("cat") == "kernel" and e["name"] == top.name:
            launch = runtime.get(e["args"]["correlation"], {"args": {}})
            ext = e["args"].get("External id", launch["args"].get("External id"))
            votes[ops.get(ext)] += 1
    assert top.launched_by == votes.most_common(1)[0][0]
    assert top.source and ".py:" in top.source and "torch" not in top.source


@needs_shared
def test_graph_replay_flagged_and_matched_to_capture():
    replay = SHARED_TRACES / "tracelens_sglang_qwen3_8b_decode_mi300x.json.gz"
    plain = analyze_paths([replay])
    assert plain.kernels[0].graph_replay_share == 1.0
    assert "graph replay" in plain.kernels[0].launched_by
    matched = analyze_paths([replay], capture=SHARED_TRACES / "tracelens_sglang_qwen3_8b_capture_bs32.json.gz")
    top = matched.kernels[0]
    assert "graph replay" not in top.launched_by and top.source.endswith(tuple("0123456789"))


def test_multi_rank_aggregates_and_reports_per_rank(tmp_path):
    ev = {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.5}
    for rank, dur in ((0, 2.5), (1, 4.0)):
        p = tmp_path / f"77-TP-{rank}-DECODE.trace.json.gz"
        p.write_bytes(gzip.compress(json.dumps({"traceEvents": [dict(ev, dur=dur)]}).encode()))
    prof = analyze_paths([tmp_path], meta={"concurrency": 4})
    assert prof.total_us == 6.5 and prof.meta["concurrency"] == 4 and prof.meta["target"] == "trace"
    assert [(r.rank, r.gpu_time_us) for r in prof.ranks] == [(0, 2.5), (1, 4.0)]


def test_cpu_only_trace_ranks_operators_by_self_time(tmp_path):
    ops = [
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 2, "dur": 7},
    ]
    p = tmp_path / "cpu.json"
    p.write_text(json.dumps({"traceEvents": ops}))
    prof = analyze_paths([p])
    # a CPU-only profile's total is CPU self time (7 + 3), labelled by time_basis
    assert prof.time_basis == "cpu_self" and prof.total_us == 10.0
    assert [(k.name, k.total_us) for k in prof.kernels] == [("inner", 7.0), ("outer", 3.0)]


def test_parts_from_gpu_annotations(tmp_path):
    k = {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7}
    events = [
        {"ph": "X", "cat": "gpu_user_annotation", "name": "attn", "pid": 0, "tid": 7, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "moe", "pid": 0, "tid": 7, "ts": 10, "dur": 10},
        dict(k, name="flash_decode", ts=1, dur=3), dict(k, name="grouped_gemm", ts=11, dur=5), dict(k, name="x", ts=30, dur=1),
    ]
    p = tmp_path / "parts.json"
    p.write_text(json.dumps({"traceEvents": events}))
    prof = analyze_paths([p])
    parts = {r.part: r.total_us for r in prof.parts}
    assert parts == {"attn": 3.0, "moe": 5.0, "(outside any annotation)": 1.0}
    assert prof.steps is None  # parts are not steps


@needs_shared
def test_steps_from_sglang_step_annotation_under_graph_replay():
    name = "tracelens_sglang_qwen3_8b_decode_mi300x.json.gz"
    events = _events(name)
    step = next(e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step["))
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    inside = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
              and e["args"].get("correlation") in runtime
              and step["ts"] <= runtime[e["args"]["correlation"]]["ts"] <= step["ts"] + step["dur"]]
    steps = analyze_paths([SHARED_TRACES / name]).steps
    assert steps["count"] == 1 and steps["steps"][0]["name"] == step["name"]
    assert steps["launches_per_step"] == len(inside)
    assert math.isclose(steps["gpu_us_per_step"], math.fsum(e["dur"] for e in inside), rel_tol=1e-12)


def _profile(cats, kernels):
    total = sum(cats.values())
    return Profile(meta={}, total_us=total,
                   kernels=[KernelRow(name=n, short_name=n, category=c, count=1, total_us=t, share=t / total) for n, c, t in kernels],
                   categories=[CategoryRow(category=c, count=1, total_us=t, share=t / total) for c, t in cats.items()])


def test_compare_verdicts():
    before = _profile({"attention": 57.0, "gemm_fp32_simt": 20.0, "elementwise": 23.0},
                      [("attn_decode", "attention", 57.0), ("sgemm", "gemm_fp32_simt", 20.0), ("ew", "elementwise", 23.0)])
    after = _profile({"attention": 5.0, "gemm_fp32_simt": 20.0, "elementwise": 23.0},
                     [("mma_decode", "attention", 5.0), ("sgemm", "gemm_fp32_simt", 20.0), ("ew", "elementwise", 23.0)])
    c = compare_profiles(before, after)
    assert c.bottleneck_moved and c.verdict.startswith("bottleneck moved: attention 57.0% -> 10.4%")
    assert c.moved[0]["name"] in ("attn_decode", "mma_decode")
    same = compare_profiles(before, before)
    assert not same.bottleneck_moved and same.verdict.startswith("bottleneck did not move")
    with pytest.raises(DsvOptError):
        compare_profiles(before, Profile(meta={}, total_us=0.0, kernels=[], categories=[], time_basis="cpu_self"))


@needs_shared
def test_operator_by_time_when_external_id_is_only_the_correlation():
    # In this older trace kernels' External id equals their correlation id, not an operator's.
    name = "hta_a100_train_control.json.gz"
    events = _events(name)
    top = analyze_paths([SHARED_TRACES / name]).kernels[0]
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    votes = Counter()
    launches = [runtime[e["args"]["correlation"]] for e in events if e.get("cat") == "kernel" and e["name"] == top.name]
    for rt in launches[:16]:
        around = [o for o in ops if o["tid"] == rt["tid"] and o["pid"] == rt["pid"] and o["ts"] <= rt["ts"] <= o["ts"] + o["dur"]]
        votes[max(around, key=lambda o: o["ts"])["name"] if around else None] += 1
    assert top.launched_by == votes.most_common(1)[0][0]


@needs_shared
def test_capture_match_names_an_operator_that_launched_that_kernel_in_the_capture():
    capture = SHARED_TRACES / "tracelens_sglang_qwen3_8b_capture_bs32.json.gz"
    prof = analyze_paths([SHARED_TRACES / "tracelens_sglang_qwen3_8b_decode_mi300x.json.gz"], capture=capture)
    events = _events(capture.name)
    ops_by_ext = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            ops_by_ext.setdefault(e["args"].get("External id"), set()).add(e["name"])
    for k in prof.kernels[:5]:
        launched = set().union(*(ops_by_ext.get(e["args"].get("External id"), set()) for e in events
                                 if e.get("cat") == "cuda_runtime" and e.get("args", {}).get("kernel") == k.name))
        assert k.launched_by in launched, k.display_name


def test_capture_without_kernel_names_matches_by_position_only_on_equal_counts(tmp_path):
    # CUDA capture traces do not name the kernel a launch call captured; position is the only link.
    rt = {"ph": "X", "cat": "cuda_runtime", "pid": 1, "tid": 1, "dur": 1.0}
    op = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "dur": 3.0}
    capture = [dict(rt, name="cudaStreamBeginCapture", ts=0.0, args={"correlation": 1})]
    for i, opname in enumerate(("aten::mm", "aten::add")):
        capture += [dict(op, name=opname, ts=10.0 * (i + 1), args={"External id": 100 + i}),
                    dict(rt, name="cudaLaunchKernel", ts=10.0 * (i + 1) + 1, args={"correlation": 2 + i, "External id": 100 + i})]
    capture.append(dict(rt, name="cudaStreamEndCapture", ts=50.0, args={"correlation": 9}))
    k = {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "args": {"correlation": 500}}
    replay = [dict(rt, name="cudaGraphLaunch", ts=0.0, args={"correlation": 500}),
              dict(k, name="ampere_sgemm_128x64_nn", ts=5.0, dur=9.0), dict(k, name="vectorized_elementwise_kernel", ts=15.0, dur=1.0),
              dict(k, name="Memset (Device)", cat="gpu_memset", ts=17.0, dur=0.5)]
    (tmp_path / "cap.json").write_text(json.dumps({"traceEvents": capture}))
    (tmp_path / "replay.json").write_text(json.dumps({"traceEvents": replay}))
    prof = analyze_paths([tmp_path / "replay.json"], capture=tmp_path / "cap.json")
    by = {r.name: r.launched_by for r in prof.kernels}
    assert by == {"ampere_sgemm_128x64_nn": "aten::mm", "vectorized_elementwise_kernel": "aten::add",
                  "Memset (Device)": "cudaGraphLaunch (graph replay)"}
    (tmp_path / "cap.json").write_text(json.dumps({"traceEvents": capture[:-3] + capture[-1:]}))  # one launch fewer
    prof = analyze_paths([tmp_path / "replay.json"], capture=tmp_path / "cap.json")
    assert all("graph replay" in r.launched_by for r in prof.kernels)
