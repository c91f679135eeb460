"""The Hopper path's hyper-connection pre step (dsv4opt/workload/kernels/mhc_fused.py): the GEMM with
its sums of squares, then the fused Sinkhorn + sum + RMSNorm, against the float64 definition
(naive.hc_pre_fused) and against the sm_120 path's sequence of kernels. Under the interpreter on a CPU
(fp16 copies, fp32 products), on a GPU in bf16 with tf32 products; outputs NaN-poisoned."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dsv4opt.numerics import error_report
from dsv4opt.workload import glue
from dsv4opt.workload.kernels import mhc, mhc_fused, naive
from dsv4opt.workload.kernels.norm import rms_norm

pytestmark = pytest.mark.skipif(
    type(mhc_fused._hc_pre_gemm_kernel).__name__ != "InterpretedFunction" and not torch.cuda.is_available(),
    reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
ACT = torch.bfloat16 if DEV == "cuda" else torch.float16
# x is rounded to the model dtype twice (the sum, then the norm): a few units of its last place
# (fp16 2^-11, bf16 2^-8); post and comb see only the GEMM's error: fp32 sums on the CPU, tf32
# products (10 mantissa bits, 2^-11 each, averaging down over K) on the GPU.
# fp32 copies: x is as exact as the GEMM behind pre.
MIX_TOL = 1e-5 if DEV == "cpu" else 2e-3
X_TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float32: MIX_TOL}
HC, N, ITERS, EPS = 4, 24, 20, 1e-6


def _inputs(T: int, d: int, seed: int = 0, dtype: torch.dtype = ACT):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(T, HC, d, generator=g).to(dtype)
    fn = torch.randn(N, HC * d, generator=g) * (HC * d) ** -0.5
    scale = torch.rand(3, generator=g) + 0.5
    base = torch.randn(N, generator=g) * 0.1
    norm = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype)
    return [t.to(DEV) for t in (h, fn, scale, base, norm)]


def _reference(h, fn, scale, base, norm):
    x, post, comb = naive.hc_pre_fused(*(t.cpu().double() for t in (h, fn, scale, base, norm)), HC, ITERS, EPS, EPS,
                                       torch.float64)
    return x, post, comb


def _fused(h, fn, scale, base, norm, splits=None):
    mix, sq = mhc_fused.hc_pre_gemm(h, fn, splits)
    return mhc_fused.hc_pre_big_fuse(mix, sq, h, scale, base, norm, HC, ITERS, EPS, EPS, h.dtype)


def _assert_close(got, want):
    for name, out, ref, tol in zip(("x", "post", "comb"), got, want, (X_TOL[got[0].dtype], MIX_TOL, MIX_TOL)):
        report = error_report(out.cpu(), ref)
        assert report.ok(tol), (name, report)


# d 24 and 100 are no power of two; K = 4d runs from 32 (one block) to 400 (several splits, the
# last one short); 33 tokens is past one tile of 16 and not a multiple of it.
@pytest.mark.parametrize("T,d,splits,dtype", [
    (1, 8, None, ACT), (3, 24, 1, ACT), (3, 100, 3, ACT), (33, 64, 2, ACT), (17, 100, None, ACT),
    (33, 24, 3, torch.float32), (3, 100, None, torch.float32),
], ids=lambda v: str(v).removeprefix("torch."))
def test_fused_pre_step_matches_float64(T, d, splits, dtype):
    inputs = _inputs(T, d, dtype=dtype)
    _assert_close(_fused(*inputs, splits=splits), _reference(*inputs))


def test_gemm_partials_sum_to_the_product_and_the_squares():
    h, fn, *_ = _inputs(5, 100)
    mix, sq = mhc_fused.hc_pre_gemm(h, fn, splits=4)
    assert mix.shape[0] > 1  # the split really happened
    flat = h.reshape(5, -1).cpu().double()
    assert error_report(mix.sum(0).cpu(), flat @ fn.cpu().double().t()).ok(MIX_TOL)
    assert error_report(sq.sum(0).cpu(), flat.square().sum(-1)).ok(1e-6)


def test_same_as_the_sm120_sequence():
    """The Hopper path's two launches compute what the sm_120 path's pre step and norm compute."""
    h, fn, scale, base, norm = _inputs(6, 64, seed=3)
    flat, rsqrt = mhc.hc_prenorm(h, EPS)
    x, post, comb = glue.hc_split_sum_eager(F.linear(flat, fn), rsqrt, flat, scale, base, HC, ITERS, EPS, ACT)
    sm120 = (rms_norm(x, norm, EPS), post, comb)
    _assert_close(_fused(h, fn, scale, base, norm), tuple(t.cpu().double() for t in sm120))


def test_the_comparison_fails_when_a_split_is_dropped():
    """The tolerance can fail: the big fuse given all but one K split is far off."""
    h, fn, scale, base, norm = _inputs(3, 100, seed=5)
    mix, sq = mhc_fused.hc_pre_gemm(h, fn, splits=4)
    assert mix.shape[0] > 1
    broken = mhc_fused.hc_pre_big_fuse(mix[1:].contiguous(), sq[1:].contiguous(), h, scale, base, norm, HC, ITERS,
                                       EPS, EPS, ACT)
    with pytest.raises(AssertionError):
        _assert_close(broken, _reference(h, fn, scale, base, norm))


def test_each_wrapper_is_one_launch(monkeypatch):
    """Each wrapper is one Triton kernel and no ATen kernel (views and allocations only)."""
    from tests.conftest import _empty
    from tests.workload.launch_count import LaunchCounter, _Counter

    monkeypatch.setattr(torch, "empty", _empty)  # the NaN poison's fill would count as a launch
    counter = LaunchCounter()
    kind = type(mhc_fused._hc_pre_gemm_kernel)  # InterpretedFunction on the CPU, JITFunction on a GPU
    monkeypatch.setattr(kind, "run", counter.one_launch(kind.run, "triton"))
    h, fn, scale, base, norm = _inputs(33, 100)
    with _Counter(counter), counter.record_function("gemm"):
        mix, sq = mhc_fused.hc_pre_gemm(h, fn, splits=3)
    with _Counter(counter), counter.record_function("fuse"):
        mhc_fused.hc_pre_big_fuse(mix, sq, h, scale, base, norm, HC, ITERS, EPS, EPS, ACT)
    assert mix.shape[0] > 1 and counter.counts == {"gemm": 1, "fuse": 1}, counter.ops
