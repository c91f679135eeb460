"""One decode step of dsv4-tiny against the all-torch float64 reference, and the step's invariants.

The baseline attention kernel runs under Triton's interpreter (float32 here: no tl.dot involved).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from dsv4opt.errors import DsvOptError  # noqa: E402
from dsv4opt.numerics import error_report  # noqa: E402
from dsv4opt.workload.attention.torch_path import sparse_decode_torch  # noqa: E402
from dsv4opt.workload.config import ModelConfig  # noqa: E402
from dsv4opt.workload.dense import GroupedDense  # noqa: E402
from dsv4opt.workload.memory import estimate_memory  # noqa: E402
from dsv4opt.workload.model import DecodeWorkload, _routed_dense  # noqa: E402
from dsv4opt.workload.reference import decode_step_ref  # noqa: E402

TINY = ModelConfig.from_name("dsv4-tiny")

# id: (concurrency, context, experts_resident, steps). Contexts are drawn in [0.75N, 1.25N]:
STEP_CASES = {
    # 1-2 tokens seen: window not full, no compressed entry yet, top-k far above the entries.
    "batch1-context-shorter-than-window": (1, 2, None, 3),
    # 30-50 tokens: 7-12 CSA entries, top-6 selects; groups complete during the steps; 3 sets.
    "varied-contexts-topk-selects": (3, 40, 3, 2),
    # HCA entries (ratio 16) exist only from 16 tokens; some requests cross the boundary.
    "hca-boundary": (3, 14, None, 2),
}


@pytest.mark.parametrize("case", STEP_CASES.values(), ids=STEP_CASES.keys())
def test_decode_steps_match_float64_reference(case):
    C, context, resident, steps = case
    wl = DecodeWorkload(TINY, concurrency=C, context=context, experts_resident=resident, dtype=torch.float32, seed=1)
    tokens = torch.randint(TINY.vocab, (C,))
    for _ in range(steps):
        ref_logits, ref_hidden = decode_step_ref(wl, tokens)
        logits = wl.step(tokens)
        assert logits.dtype == torch.float32 and logits.shape == (C, TINY.vocab)
        for out, ref in ((logits, ref_logits), (wl.last_hidden, ref_hidden)):
            report = error_report(out, ref)
            assert report.ok(1e-4), report
        tokens = logits.argmax(-1)


def test_reference_sees_a_changed_cache():
    """The comparison above is not vacuous: disturbing one cached window entry moves the logits."""
    wl = DecodeWorkload(TINY, concurrency=1, context=40, dtype=torch.float32)
    tokens = torch.tensor([7])
    before, _ = decode_step_ref(wl, tokens)
    layer = wl.layers[0]
    pos = int(wl.pos[0])
    layer.cache["pool"][0, (pos - 1) % TINY.window] += 5.0
    after, _ = decode_step_ref(wl, tokens)
    assert not error_report(after, before).ok(1e-4)
    assert not error_report(wl.step(tokens), before).ok(1e-4)


def test_bf16_step_stays_close_to_reference():
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.bfloat16)
    tokens = torch.tensor([3, 9])
    ref, _ = decode_step_ref(wl, tokens)
    report = error_report(wl.step(tokens), ref)
    assert report.ok(5e-2), report


def test_same_arguments_same_workload():
    a = DecodeWorkload(TINY, concurrency=3, context=20, dtype=torch.float32, seed=4)
    b = DecodeWorkload(TINY, concurrency=3, context=20, dtype=torch.float32, seed=4)
    c = DecodeWorkload(TINY, concurrency=3, context=20, dtype=torch.float32, seed=5)
    for wl in (a, b):  # the interpreter is slow; any implementation of the slot shows determinism
        wl.impls["attention"] = sparse_decode_torch
    assert torch.equal(a.contexts, b.contexts)
    assert torch.equal(a.layers[2].cache["pool"], b.layers[2].cache["pool"])
    tokens = torch.tensor([1, 2, 3])
    assert torch.equal(a.step(tokens), b.step(tokens))
    assert not torch.equal(a.layers[2].cache["pool"], c.layers[2].cache["pool"])


def test_step_advances_every_request():
    wl = DecodeWorkload(TINY, concurrency=2, context=10, dtype=torch.float32)
    start = wl.pos.clone()
    wl.step(torch.tensor([0, 1]))
    wl.step(torch.tensor([0, 1]))
    assert torch.equal(wl.pos, start + 2)
    assert torch.equal(wl.contexts, start)  # the drawn contexts stay as drawn (they go into meta)
    assert wl.last_hidden.shape == (2, TINY.hidden)


ROUTING_CASES = {  # id: (tokens, experts, resident sets, top-k)
    "one-token": (1, 16, 4, 3),
    "sets-shared-within-a-token": (5, 16, 2, 6),
    "more-sets-than-routes": (2, 16, 16, 3),
}


@pytest.mark.parametrize("case", ROUTING_CASES.values(), ids=ROUTING_CASES.keys())
def test_grouped_experts_match_dense_fallback(case):
    T, E, R, k = case
    wl = DecodeWorkload(TINY, concurrency=1, context=4, dtype=torch.float32)
    d, F = 24, 8
    layer = wl.layers[0]
    layer.w["w13"] = GroupedDense(torch.randn(R, 2 * F, d))
    layer.w["w2"] = GroupedDense(torch.randn(R, d, F))
    wl.experts_resident = R
    x = torch.randn(T, d)
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
    gates = torch.rand(T, k)
    out = wl._routed_experts(layer, x, ids, gates)
    dense = _routed_dense(x, ids % R, gates, layer.w["w13"].stacked(), layer.w["w2"].stacked(), R)
    report = error_report(out, dense)
    assert report.ok(1e-5), report


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_memory_estimate_covers_what_is_allocated(dtype):
    for C, context in ((1, 1), (3, 40), (2, 300)):
        wl = DecodeWorkload(TINY, concurrency=C, context=context, dtype=dtype)
        held = wl.state_bytes()
        est = estimate_memory(TINY, C, context, elem_bytes=dtype.itemsize)
        assert est.weights == held["weights"]
        # The estimate takes the longest context the draw allows (1.25 x the mean); the draw may be shorter.
        assert held["caches"] <= est.caches <= 1.25 * held["caches"]


def test_bad_arguments_raise_user_errors():
    with pytest.raises(DsvOptError, match="experts-resident"):
        DecodeWorkload(TINY, concurrency=1, context=4, experts_resident=TINY.experts + 1)
    with pytest.raises(DsvOptError, match="weight format"):
        DecodeWorkload(TINY, concurrency=1, context=4, weights="int4")


def test_fp8_weights_match_reference_of_their_dequantised_values():
    """fp8 projections on the CPU (torch._scaled_mm runs there); the grouped fp8 GEMM does not,
    so the experts fall back to the model dtype and say so. The reference applies the dequantised
    weights exactly; what remains is the per-token activation quantisation (e4m3: 3 mantissa bits)."""
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.bfloat16, weights="fp8")
    assert wl.layers[2].w["q_b"].format == "fp8"
    if not hasattr(torch.ops.aten, "_scaled_grouped_mm") or not torch.cuda.is_available():
        assert any(f.startswith("w13") for f in wl.fp8_fallbacks)
    tokens = torch.tensor([3, 9])
    ref, _ = decode_step_ref(wl, tokens)
    report = error_report(wl.step(tokens), ref)
    assert report.ok(0.15), report


def test_memory_estimate_of_fp8_projections():
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.bfloat16, weights="fp8")
    expert_fallback = all(f.startswith(("w13", "w2")) for f in wl.fp8_fallbacks)
    assert expert_fallback, wl.fp8_fallbacks  # on a CPU only the grouped fp8 GEMM is missing
    est = estimate_memory(TINY, 2, 40, elem_bytes=2, fp8=True, fp8_experts=wl.layers[0].w["w13"].format == "fp8")
    assert est.weights == wl.state_bytes()["weights"]
