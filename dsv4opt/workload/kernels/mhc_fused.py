"""The hyper-connection pre step as SGLang 0.5.23 runs it on Hopper: one GEMM, then one fused kernel.

With SGLANG_OPT_DEEPGEMM_HC_PRENORM and SGLANG_OPT_FUSE_MHC_POST_PRE on (Hopper's defaults,
srt/environ.py:1819-1823), every post -> pre boundary of more than 32 tokens runs TileLang's
`mhc_post`, DeepGEMM's `tf32_hc_prenorm_gemm` and TileLang's `mhc_pre_big_fuse_with_norm`
(sglang/kernels/ops/layernorm/mhc.py:1733-1832; up to 32 tokens one TileLang kernel does the post
and the GEMM's partials together). DeepGEMM and TileLang compile with nvcc at run time; these
Triton kernels stand in for the last two:

- `hc_pre_gemm` for `tf32_hc_prenorm_gemm`: the residual copies flattened to fp32 times the
  pre-mix weight on tf32 tensor cores, split over K, each split writing its partial products and
  its partial sum of squares (the RMS factor's input) in the same pass over the copies.
- `hc_pre_big_fuse` for `mhc_pre_big_fuse_with_norm`: per token, the partials summed, the RMS
  factor, the sigmoid gates and Sinkhorn (kernels/mhc.py's helpers), the weighted sum of the copies
  and the sublayer's RMSNorm, in one program.

Same maths as the sm_120 path's hc_prenorm -> F.linear -> split, Sinkhorn and sum -> rms_norm
(kernels/naive.py: hc_pre_fused), with the linear in tf32 instead of fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import runs_triton
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.kernels.mhc import hc_post_comb, hc_pre_gate

_TARGET_PROGRAMS = 128  # about one per SM on an H200 (132 SMs)


@triton.jit
def _hc_pre_gemm_kernel(p_h, p_fn, p_mix, p_sq, T, N, K, s_ht, s_fn, s_ms, s_mt,
                        K_PER_SPLIT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    i_t = tl.program_id(0)
    i_split = tl.program_id(1).to(tl.int64)
    o_t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_n = tl.arange(0, BLOCK_N)
    m_t = o_t < T
    m_n = o_n < N
    b_acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)  # [BT, BN]
    b_sq = tl.zeros([BLOCK_T], dtype=tl.float32)  # [BT]
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        o_k = i_split * K_PER_SPLIT + k0 + tl.arange(0, BLOCK_K)
        m_k = (o_k < K) & (k0 + tl.arange(0, BLOCK_K) < K_PER_SPLIT)
        b_x = tl.load(p_h + o_t[:, None].to(tl.int64) * s_ht + o_k[None, :],
                      mask=m_t[:, None] & m_k[None, :], other=0.0).to(tl.float32)  # [BT, BK]
        b_w = tl.load(p_fn + o_n[:, None] * s_fn + o_k[None, :], mask=m_n[:, None] & m_k[None, :], other=0.0)  # [BN, BK]
        b_acc += tl.dot(b_x, tl.trans(b_w))  # fp32 operands: tf32 tensor cores on the GPU
        b_sq += tl.sum(b_x * b_x, axis=1)
    tl.store(p_mix + i_split * s_ms + o_t[:, None] * s_mt + o_n[None, :], b_acc, mask=m_t[:, None] & m_n[None, :])
    tl.store(p_sq + i_split * T + o_t, b_sq, mask=m_t)


def _block_t(T: int) -> int:
    return min(64, max(16, triton.next_power_of_2(T)))


_BLOCK_K = 128


def gemm_splits(T: int, K: int, splits: int | None = None) -> tuple[int, int]:
    """(K splits, columns a split) hc_pre_gemm uses for T tokens and K columns; `splits` asked or
    enough programs to fill the GPU. Its partials' first dimension (a fake needs it too)."""
    n_t = triton.cdiv(T, _block_t(T))
    splits = splits or max(1, min(triton.cdiv(K, _BLOCK_K), _TARGET_PROGRAMS // n_t))
    k_per_split = triton.cdiv(triton.cdiv(K, splits), _BLOCK_K) * _BLOCK_K
    return triton.cdiv(K, k_per_split), k_per_split


def hc_pre_gemm(h: torch.Tensor, fn: torch.Tensor, splits: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h: [T, hc, d] (model dtype), fn: [N, hc*d] fp32 -> (mix partials [S, T, N], sum-of-squares
    partials [S, T]), fp32: summed over S they are flat @ fn^T and sum(flat^2), flat = h as fp32.
    `splits`: the K splits (default: enough programs to fill the GPU)."""
    T = h.shape[0]
    h2 = h.reshape(T, -1)
    if not runs_triton(h):
        mix, sq = naive.hc_pre_gemm(h2, fn)
        return mix[None], sq[None]
    N, K = fn.shape
    assert h2.shape[1] == K and h2.stride(1) == 1 and fn.stride(1) == 1 and fn.dtype == torch.float32, (h2.shape, fn.shape)
    BLOCK_T, BLOCK_K = _block_t(T), _BLOCK_K
    n_t = triton.cdiv(T, BLOCK_T)
    splits, k_per_split = gemm_splits(T, K, splits)
    mix = torch.empty(splits, T, N, device=h.device, dtype=torch.float32)
    sq = torch.empty(splits, T, device=h.device, dtype=torch.float32)
    if T:
        _hc_pre_gemm_kernel[(n_t, splits)](
            h2, fn, mix, sq, T, N, K, h2.stride(0), fn.stride(0), mix.stride(0), mix.stride(1),
            K_PER_SPLIT=k_per_split, BLOCK_T=BLOCK_T, BLOCK_N=max(16, triton.next_power_of_2(N)), BLOCK_K=BLOCK_K,
        )
    return mix, sq


@triton.jit
def _hc_pre_big_fuse_kernel(p_mix, p_sq, p_row, p_h, p_scale, p_base, p_norm, p_x, p_post, p_comb,
                            S, T, K, s_ms, s_mt, s_ht, s_hh, hc_eps, norm_eps,
                            D: tl.constexpr, HC: tl.constexpr, N: tl.constexpr, N_P: tl.constexpr,
                            ITERS: tl.constexpr, BLOCK_D: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    o_n = tl.arange(0, N_P)
    m_n = o_n < N
    b_mix = tl.zeros([N_P], dtype=tl.float32)  # [N_P]
    b_sq = 0.0
    for s in range(0, S):
        b_mix += tl.load(p_mix + s * s_ms + i_t * s_mt + o_n, mask=m_n, other=0.0)
        b_sq += tl.load(p_sq + s * T + i_t)
    rsqrt = tl.rsqrt(b_sq / K + norm_eps)
    # the summed row through scratch, so the gate and Sinkhorn helpers read it as they read a mix row
    tl.store(p_row + i_t * N + o_n, b_mix, mask=m_n)
    tl.debug_barrier()
    b_pre = hc_pre_gate(p_row + i_t * N, p_scale, p_base, rsqrt, hc_eps, HC)  # [HC]
    hc_post_comb(p_row + i_t * N, p_scale, p_base, p_post + i_t * HC, p_comb + i_t * HC * HC, rsqrt, hc_eps, HC, ITERS)
    # x = sum_i pre_i * copy_i, rounded to the model dtype; then its RMSNorm (two passes over d)
    o_j = tl.arange(0, HC)
    b_ss = tl.zeros([BLOCK_D], dtype=tl.float32)  # [BD]
    for d0 in range(0, D, BLOCK_D):
        o_d = d0 + tl.arange(0, BLOCK_D)
        m_d = o_d < D
        b_h = tl.load(p_h + i_t * s_ht + o_j[:, None] * s_hh + o_d[None, :], mask=m_d[None, :], other=0.0)  # [HC, BD]
        b_x = tl.sum(b_pre[:, None] * b_h.to(tl.float32), axis=0).to(p_x.dtype.element_ty)  # [BD]
        tl.store(p_x + i_t * D + o_d, b_x, mask=m_d)
        b_ss += b_x.to(tl.float32) * b_x.to(tl.float32)
    r = tl.rsqrt(tl.sum(b_ss, axis=0) / D + norm_eps)
    tl.debug_barrier()
    for d0 in range(0, D, BLOCK_D):
        o_d = d0 + tl.arange(0, BLOCK_D)
        m_d = o_d < D
        b_x = tl.load(p_x + i_t * D + o_d, mask=m_d, other=0.0).to(tl.float32)
        b_w = tl.load(p_norm + o_d, mask=m_d, other=0.0).to(tl.float32)
        tl.store(p_x + i_t * D + o_d, (b_x * r * b_w).to(p_x.dtype.element_ty), mask=m_d)


def hc_pre_big_fuse(mix: torch.Tensor, sq: torch.Tensor, h: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                    norm_weight: torch.Tensor, hc: int, iters: int, hc_eps: float, norm_eps: float,
                    dtype: torch.dtype):
    """hc_pre_gemm's partials and the copies h [T, hc, d] -> (x normed [T, d] in `dtype`, post [T, hc],
    comb [T, hc, hc] fp32); `norm_eps` serves the RMS factor and the RMSNorm, as in the model."""
    T, _, d = h.shape
    if not runs_triton(h):
        return naive.hc_pre_from_partials(mix, sq, h, scale, base, norm_weight, hc, iters, hc_eps, norm_eps, dtype)
    S, _, N = mix.shape
    assert mix.is_contiguous() and sq.is_contiguous() and h.stride(2) == 1 and hc & (hc - 1) == 0, (mix.shape, hc)
    assert scale.is_contiguous() and base.is_contiguous() and norm_weight.is_contiguous(), "1-D weights read densely"
    row = torch.empty(T, N, device=h.device, dtype=torch.float32)
    x = torch.empty(T, d, device=h.device, dtype=dtype)
    post = torch.empty(T, hc, device=h.device, dtype=torch.float32)
    comb = torch.empty(T, hc, hc, device=h.device, dtype=torch.float32)
    if T:
        _hc_pre_big_fuse_kernel[(T,)](
            mix, sq, row, h, scale, base, norm_weight, x, post, comb, S, T, hc * d, mix.stride(0), mix.stride(1),
            h.stride(0), h.stride(1), hc_eps, norm_eps,
            D=d, HC=hc, N=N, N_P=triton.next_power_of_2(N), ITERS=iters, BLOCK_D=min(1024, triton.next_power_of_2(d)),
            num_warps=4,
        )
    return x, post, comb
