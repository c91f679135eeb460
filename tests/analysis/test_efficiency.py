"""FLOP/byte models and achieved rates, against hand arithmetic and a plain-json walk of a real trace."""

import gzip
import json
import math
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from dsv4opt.analysis import attribute
from dsv4opt.analysis.classify import classify_names
from dsv4opt.analysis.devices import peak_of
from dsv4opt.analysis.efficiency import kernel_efficiency, modelled_ops, op_model
from dsv4opt.trace import read_trace
from dsv4opt.trace.reader import OpShapes
from tests.helpers import SHARED_TRACES

BF, F32, F8 = "c10::BFloat16", "float", "c10::Float8_e4m3fn"


def shapes(dims, types, concrete=()):
    return OpShapes(dims, list(types), list(concrete))


MODELS = [
    ("aten::mm", shapes([[64, 512], [512, 256]], [BF, BF]), (2 * 64 * 256 * 512, 2 * (64 * 512 + 512 * 256 + 64 * 256), "bf16")),
    ("aten::addmm", shapes([[256], [64, 512], [512, 256], [], []], [BF, BF, BF, "Scalar", "Scalar"]),
     (2 * 64 * 256 * 512, 2 * (256 + 64 * 512 + 512 * 256 + 64 * 256), "bf16")),
    ("aten::bmm", shapes([[8, 16, 32], [8, 32, 4]], [F32, F32]), (2 * 8 * 16 * 4 * 32, 4 * 8 * (16 * 32 + 32 * 4 + 16 * 4), "fp32")),
    ("aten::linear", shapes([[2, 3, 128], [64, 128], [64]], [BF, BF, BF]),
     (2 * 6 * 64 * 128, 2 * (6 * 128 + 128 * 64 + 6 * 64 + 64), "bf16")),
    ("aten::_scaled_mm", shapes([[32, 256], [256, 128], [], []], [F8, F8, F32, F32]),
     (2 * 32 * 128 * 256, 32 * 256 + 256 * 128 + 2 * 32 * 128, "fp8")),
    # B=2, H=4, Lq=Lk=8, D=Dv=16; causal: row i sees i+1 keys, 36 pairs of 64
    ("aten::_scaled_dot_product_flash_attention", shapes([[2, 4, 8, 16]] * 3 + [[]] * 4, [BF] * 3 + ["Scalar"] * 4, ["", "", "", "0.", "True", "False", ""]),
     (2 * 2 * 4 * 36 * 32, 2 * 4 * 2 * 4 * 8 * 16, "bf16")),
    ("aten::_flash_attention_forward", shapes([[2, 1, 4, 16], [2, 8, 4, 16], [2, 8, 4, 16]], [BF] * 3, [""] * 8 + ["False"]),
     (2 * 2 * 4 * 8 * 32, 2 * (2 * 4 * 16 + 2 * 2 * 8 * 4 * 16 + 2 * 4 * 16), "bf16")),
    ("aten::mul", shapes([[4, 1, 8], [3, 1], []], [F32, F32, "double"]), (4 * 3 * 8, 4 * (32 + 3 + 96), None)),
    ("aten::silu", shapes([[10, 10]], [BF]), (100, 2 * 2 * 100, None)),
    ("aten::copy_", shapes([[5, 7], [5, 7], []], [BF, F32, "Scalar"]), (0, 2 * 35 + 4 * 35, None)),
]


@pytest.mark.parametrize("name,s,want", MODELS, ids=[m[0] for m in MODELS])
def test_operator_models_against_hand_arithmetic(name, s, want):
    assert name in modelled_ops()
    flop, nbytes, kind = op_model(name, s)
    assert (flop, nbytes, kind) == (float(want[0]), float(want[1]), want[2])


def test_no_model_without_shapes_or_for_unmodelled_ops():
    assert op_model("aten::mm", None) is None
    assert op_model("aten::mm", shapes([[4]], [BF])) is None  # malformed for a GEMM
    assert op_model("aten::topk", shapes([[4, 4]], [BF])) is None
    assert op_model("aten::_flash_attention_forward", shapes([[9, 4, 16], [9, 4, 16], [9, 4, 16]], [BF] * 3)) is None  # varlen


def test_call_shared_among_its_kernels_by_time():
    # one aten::mm call launching a GEMM (3 us) and a split-K reduce (1 us): 2 GFLOP over 4 us
    ops = pd.DataFrame({"name": ["aten::mm"], "shapes": [shapes([[1000, 1000], [1000, 1000]], [BF, BF])]})
    k = pd.DataFrame({"name": ["gemm", "splitKreduce"], "cat": ["kernel", "kernel"], "category": ["gemm_tc", "gemm_tc"],
                      "dur_us": [3.0, 1.0]})
    e = kernel_efficiency(k, np.array([0, 0]), ops, peak_of("NVIDIA H200")).set_index("name")
    assert math.isclose(e.loc["gemm", "flop"], 2e9 * 3 / 4) and math.isclose(e.loc["splitKreduce", "flop"], 2e9 / 4)
    assert math.isclose(e.loc["gemm", "tflops"], 2e9 / 4e-6 / 1e12)
    assert math.isclose(e.loc["gemm", "compute_of_peak"], 500.0 / 989.4)  # H200 dense BF16: 989.4 TFLOP/s
    assert math.isclose(e.loc["gemm", "bandwidth_of_peak"], 6e6 / 4e-6 / 4.8e12)  # 3 x 1000^2 bf16 over 4.8 TB/s
    none = kernel_efficiency(k, np.array([-1, -1]), ops, None)
    assert none.empty and list(none.columns) == list(e.reset_index().columns)


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces absent")
def test_gemm_rate_on_a_real_trace_against_plain_json():
    path = SHARED_TRACES / "tracelens_h100_qwen1.5_0.5b.json.gz"
    trace = read_trace(path, shapes_of=modelled_ops())
    la = attribute.launch_info(trace)
    rows = attribute.Attributor(trace).operator_rows(la["external_id"].to_numpy(), la["launch_pid"].to_numpy(),
                                                     la["launch_tid"].to_numpy(), la["launch_ts_us"].to_numpy())
    k = trace.kernels.assign(category=classify_names(trace.kernels["name"].astype(object)))
    got = kernel_efficiency(k, rows, trace.cpu_ops, peak_of(trace.device)).set_index("name")

    # Independently: kernel -> External id -> the shortest cpu_op with it; FLOPs 2MNK from its
    # Input Dims, shared among the call's kernels by duration.
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    ops = {}
    for e in sorted((e for e in events if e.get("cat") == "cpu_op"), key=lambda e: -e["dur"]):
        ops[e["args"].get("External id")] = e
    kernels = [e for e in events if e.get("cat") == "kernel"]
    call_us = defaultdict(float)
    for e in kernels:
        call_us[e["args"].get("External id")] += e["dur"]
    gemm = max({e["name"] for e in kernels if e["name"].startswith("sm90_xmma_gemm")}, key=lambda n: sum(e["dur"] for e in kernels if e["name"] == n))
    flop = dur = 0.0
    for e in kernels:
        op = ops.get(e["args"].get("External id"))
        if e["name"] != gemm or op is None or op["name"] not in ("aten::mm", "aten::addmm"):
            continue
        d = op["args"]["Input Dims"][1:] if op["name"] == "aten::addmm" else op["args"]["Input Dims"]
        (m, kk), (_, n) = d[0], d[1]
        flop += 2 * m * n * kk * e["dur"] / call_us[e["args"]["External id"]]
        dur += e["dur"]
    assert dur > 0 and math.isclose(got.loc[gemm, "modelled_us"], dur, rel_tol=1e-12)
    assert math.isclose(got.loc[gemm, "flop"], flop, rel_tol=1e-9)
    assert math.isclose(got.loc[gemm, "compute_of_peak"], flop / dur / 1e6 / 989.4, rel_tol=1e-9)  # H100 SXM BF16


def test_graph_replays_take_the_reference_call_once_per_launch(tmp_path):
    from dsv4opt.analysis import analyze_paths

    m, k, n = 256, 512, 128
    props = {"deviceProperties": [{"name": "NVIDIA H200"}]}
    reference = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0,
         "args": {"External id": 1, "Input Dims": [[m, k], [k, n]], "Input type": [BF, BF]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0,
         "args": {"correlation": 11, "External id": 1}},
        {"ph": "X", "cat": "kernel", "name": "gemm_bf16", "pid": 0, "tid": 7, "ts": 20.0, "dur": 5.0,
         "args": {"correlation": 11, "External id": 1}},
    ]
    replay = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0, "args": {"correlation": 500}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 100.0, "dur": 1.0, "args": {"correlation": 501}},
        {"ph": "X", "cat": "kernel", "name": "gemm_bf16", "pid": 0, "tid": 7, "ts": 5.0, "dur": 4.0, "args": {"correlation": 500}},
        {"ph": "X", "cat": "kernel", "name": "gemm_bf16", "pid": 0, "tid": 7, "ts": 105.0, "dur": 2.0, "args": {"correlation": 501}},
    ]
    (tmp_path / "ref.json").write_text(json.dumps({"traceEvents": reference, **props}))
    (tmp_path / "replay.json").write_text(json.dumps({"traceEvents": replay, **props}))
    plain = analyze_paths([tmp_path / "replay.json"])
    assert plain.kernels[0].efficiency is None  # a replayed kernel has no operator of its own
    row = analyze_paths([tmp_path / "replay.json"], capture=tmp_path / "ref.json").kernels[0].efficiency
    flop = 2.0 * m * n * k  # per replay: each graph launch ran the captured call once
    assert row.op == "aten::mm" and row.launches == 2 and row.modelled_us == 6.0
    assert math.isclose(row.tflops, 2 * flop / 6e-6 / 1e12, rel_tol=1e-12)
    assert math.isclose(row.compute_of_peak, 2 * flop / 6e-6 / 989.4e12, rel_tol=1e-12)
