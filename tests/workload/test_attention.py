"""Sparse decode attention of the workload: the float64 reference against an explicit loop, and the
baseline (SGLang's sm_120 path: the CUDA-core kernel under the interpreter, eager merge and sink)
and the torch path against the reference, in both cache layouts."""

from __future__ import annotations

import math
import pytest
import torch

from dsv4opt.numerics import error_report
from dsv4opt.optimizations.mma_attn.cases import AttnCase, make_inputs
from dsv4opt.workload.attention import simt, sparse_attention_ref, sparse_decode_sm120
from dsv4opt.workload.attention.sm120 import apply_sink, merge_partials
from dsv4opt.workload.attention.torch_path import sparse_decode_torch

interpreted = pytest.mark.skipif(
    type(simt._simt_sparse_decode_kernel).__name__ != "InterpretedFunction" and not torch.cuda.is_available(),
    reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import",
)
SMALL = dict(heads=4, dim=32, rope_dim=8, tile=8, window=8)


def test_reference_matches_an_explicit_loop():
    x = make_inputs(AttnCase(2, 5, "half_unused", layout="bf16", **SMALL), "cpu", torch.float64)
    x.extra_lengths[1] = 3
    o, lse = sparse_attention_ref(*x.args())
    for b in range(2):
        rows = []
        for cache, idx, n in ((x.swa, x.swa_indices, x.swa_lengths), (x.extra, x.extra_indices, x.extra_lengths)):
            rows += [cache.read(idx[b, k : k + 1])[0] for k in range(idx.shape[1]) if idx[b, k] >= 0 and k < n[b]]
        for h in range(4):
            logits = [x.scale * float(x.q[b, h] @ r) for r in rows]
            den = math.exp(float(x.sink[h])) + sum(math.exp(v) for v in logits)
            assert float(lse[b, h]) == pytest.approx(math.log(den), rel=1e-12)
            want = sum((math.exp(v) / den) * r for v, r in zip(logits, rows))
            torch.testing.assert_close(o[b, h], want, rtol=1e-12, atol=1e-12)


def test_reference_request_with_no_used_slot_is_zero_with_sink_lse():
    x = make_inputs(AttnCase(3, 7, "one_empty", layout="bf16", **SMALL), "cpu", torch.float64)
    x.swa_indices[0] = -1
    o, lse = sparse_attention_ref(*x.args())
    assert torch.equal(o[0], torch.zeros_like(o[0]))
    torch.testing.assert_close(lse[0], x.sink.double())


def test_merge_then_sink_equals_one_softmax_over_both():
    x = make_inputs(AttnCase(3, 20, "short", layout="bf16", **SMALL), "cpu", torch.float32)
    o1, l1 = sparse_decode_torch(x.q, x.swa, x.swa_indices, x.swa_lengths, x.scale)
    o2, l2 = sparse_decode_torch(x.q, x.extra, x.extra_indices, x.extra_lengths, x.scale)
    o, lse = apply_sink(*merge_partials(o1, l1, o2, l2), x.sink)
    ref_o, ref_lse = sparse_attention_ref(*x.args())
    assert error_report(o, ref_o).ok(1e-5) and error_report(lse, ref_lse).ok(1e-5)


CASES = [
    AttnCase(1, 1, "all", **SMALL),
    AttnCase(3, 37, "half_unused", **SMALL),
    AttnCase(3, 37, "one_empty", **SMALL),
    AttnCase(2, 100, "short", layout="bf16", **SMALL),
    AttnCase(2, 0, "short", **SMALL),
]


@interpreted
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_sm120_baseline_matches_reference(case):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    x = make_inputs(case, device, dtype, seed=1)
    o, lse = sparse_decode_sm120(*x.args())
    ref_o, ref_lse = sparse_attention_ref(*x.args())
    assert o.dtype == x.q.dtype and lse.dtype == torch.float32
    assert error_report(o, ref_o).ok(1e-2), error_report(o, ref_o)
    assert error_report(lse, ref_lse).ok(1e-5), error_report(lse, ref_lse)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_torch_path_matches_reference(case):
    x = make_inputs(case, "cpu", torch.float32, seed=2)
    o1, l1 = sparse_decode_torch(x.q, x.swa, x.swa_indices, x.swa_lengths, x.scale)
    if x.extra is not None:
        o2, l2 = sparse_decode_torch(x.q, x.extra, x.extra_indices, x.extra_lengths, x.scale)
        o1, l1 = merge_partials(o1, l1, o2, l2)
    o, lse = apply_sink(o1, l1, x.sink)
    ref_o, ref_lse = sparse_attention_ref(*x.args())
    assert error_report(o, ref_o).ok(1e-5) and error_report(lse, ref_lse).ok(1e-5)
