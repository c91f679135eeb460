"""Sparse decode attention of the workload: the float64 reference against an explicit loop, and the
baseline CUDA-core kernel (Triton interpreter, fp16) and the torch path against the reference."""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from dsv4opt.numerics import error_report  # noqa: E402
from dsv4opt.workload.attention import simt  # noqa: E402
from dsv4opt.workload.attention import sparse_attention_ref, sparse_decode_simt, sparse_decode_torch  # noqa: E402

interpreted = pytest.mark.skipif(
    type(simt._simt_sparse_decode_kernel).__name__ != "InterpretedFunction" and not torch.cuda.is_available(),
    reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import",
)


def _inputs(B, H, D, K, pattern, dtype, pool=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, D, generator=gen).to(dtype)
    kv = torch.randn(pool, D, generator=gen).to(dtype)
    sink = torch.randn(H, generator=gen)
    indices = torch.stack([torch.randperm(pool, generator=gen)[:K] for _ in range(B)]).to(torch.int32)
    lengths = torch.full((B,), K, dtype=torch.int32)
    if pattern == "half_unused":
        indices[torch.rand(B, K, generator=gen) < 0.5] = -1
    elif pattern == "one_empty":
        indices[0] = -1
    elif pattern == "short":
        lengths = torch.randint(0, K, (B,), generator=gen, dtype=torch.int32)
    return q, kv, indices, lengths, sink, D**-0.5


def test_reference_matches_an_explicit_loop():
    q, kv, indices, lengths, sink, scale = _inputs(2, 3, 8, 5, "half_unused", torch.float64, pool=20)
    lengths[1] = 3
    o, lse = sparse_attention_ref(q, kv, indices, lengths, sink, scale)
    for b in range(2):
        used = [int(indices[b, k]) for k in range(5) if indices[b, k] >= 0 and k < lengths[b]]
        for h in range(3):
            logits = [scale * float(q[b, h] @ kv[r]) for r in used]
            den = math.exp(float(sink[h])) + sum(math.exp(x) for x in logits)
            assert float(lse[b, h]) == pytest.approx(math.log(den), rel=1e-12)
            expected = sum((math.exp(x) / den) * kv[r] for x, r in zip(logits, used)) if used else torch.zeros(8)
            torch.testing.assert_close(o[b, h], torch.as_tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_reference_request_with_no_used_slot_is_zero_with_sink_lse():
    q, kv, indices, lengths, sink, scale = _inputs(3, 4, 16, 7, "one_empty", torch.float64)
    lengths[2] = 0
    o, lse = sparse_attention_ref(q, kv, indices, lengths, sink, scale)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    for b in (0, 2):
        assert torch.equal(o[b], torch.zeros_like(o[b]))
        torch.testing.assert_close(lse[b], sink.double())


CASES = [
    pytest.param(1, 4, 64, 1, "all", id="B1-K1-all"),
    pytest.param(3, 4, 64, 37, "half_unused", id="B3-K37-half_unused"),
    pytest.param(3, 4, 64, 37, "one_empty", id="B3-K37-one_empty"),
    pytest.param(2, 2, 48, 100, "short", id="B2-K100-short-D48"),
]


@interpreted
@pytest.mark.parametrize("B,H,D,K,pattern", CASES)
def test_simt_kernel_matches_reference(B, H, D, K, pattern):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float16
    q, kv, indices, lengths, sink, scale = (t.to(device) if torch.is_tensor(t) else t for t in _inputs(B, H, D, K, pattern, dtype))
    o, lse = sparse_decode_simt(q, kv, indices, lengths, sink, scale)
    ref_o, ref_lse = sparse_attention_ref(q, kv, indices, lengths, sink, scale)
    assert o.dtype == q.dtype and lse.dtype == torch.float32
    assert error_report(o, ref_o).ok(1e-2), error_report(o, ref_o)
    assert error_report(lse, ref_lse).ok(1e-5), error_report(lse, ref_lse)


# bf16 scores come out of the bmm rounded to bf16, hence the looser lse bound there.
@pytest.mark.parametrize("dtype,tol,lse_tol", [(torch.float32, 1e-5, 1e-5), (torch.bfloat16, 1e-2, 1e-3)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("B,H,D,K,pattern", CASES)
def test_torch_path_matches_reference(B, H, D, K, pattern, dtype, tol, lse_tol):
    q, kv, indices, lengths, sink, scale = _inputs(B, H, D, K, pattern, dtype)
    o, lse = sparse_decode_torch(q, kv, indices, lengths, sink, scale)
    ref_o, ref_lse = sparse_attention_ref(q, kv, indices, lengths, sink, scale)
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert error_report(o, ref_o).ok(tol), error_report(o, ref_o)
    assert error_report(lse, ref_lse).ok(lse_tol), error_report(lse, ref_lse)
