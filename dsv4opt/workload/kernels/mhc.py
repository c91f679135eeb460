"""Hyper-connection kernels of the sm_120 path.

- `hc_prenorm` stands for the Inductor kernel(s) SGLang compiles from `hc_pre_torch_impl` in capture
  mode (deepseek_v4.py:1246): the residual copies flattened to fp32 and their RMS factor, in one pass.
- `hc_split_sinkhorn` stands for the TileLang `hc_split_sinkhorn` kernel (layers/mhc.py:33-121): the
  24 mixing numbers -> pre, post and a doubly-stochastic comb after all Sinkhorn iterations, one
  program per token.
- `hc_post` stands for the TileLang `mhc_post` kernel (layers/mhc.py:950-1012):
  out_i = post_i * y + sum_j comb[j, i] * residual_j.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import runs_triton
from dsv4opt.workload.kernels import naive


@triton.jit
def _hc_prenorm_kernel(p_h, p_flat, p_rsqrt, stride_h, stride_f, eps,
                       K: tl.constexpr, BLOCK: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    b_ss = tl.zeros([BLOCK], tl.float32)  # [BLOCK] partial sums of squares
    for k0 in range(0, K, BLOCK):
        o_k = k0 + tl.arange(0, BLOCK)
        m_k = o_k < K
        b_x = tl.load(p_h + i_t * stride_h + o_k, mask=m_k, other=0.0).to(tl.float32)  # [BLOCK]
        tl.store(p_flat + i_t * stride_f + o_k, b_x, mask=m_k)
        b_ss += b_x * b_x
    tl.store(p_rsqrt + i_t, tl.rsqrt(tl.sum(b_ss, axis=0) / K + eps))


def hc_prenorm(h: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """h: [T, hc, d] -> (flat [T, hc*d] fp32, rsqrt [T] fp32 = 1 / sqrt(mean(flat^2) + eps))."""
    T = h.shape[0]
    h2 = h.reshape(T, -1)
    if not runs_triton(h):
        return naive.hc_prenorm(h2, eps)
    assert h2.stride(1) == 1
    K = h2.shape[1]
    flat = torch.empty(T, K, device=h.device, dtype=torch.float32)
    rsqrt = torch.empty(T, device=h.device, dtype=torch.float32)
    if T:
        block = min(2048, triton.next_power_of_2(K))
        _hc_prenorm_kernel[(T,)](p_h=h2, p_flat=flat, p_rsqrt=rsqrt, stride_h=h2.stride(0), stride_f=flat.stride(0),
                                 eps=eps, K=K, BLOCK=block, num_warps=4)
    return flat, rsqrt


@triton.jit
def hc_pre_gate(p_row, p_scale, p_base, factor, eps, HC: tl.constexpr):
    """pre = sigmoid(mix[:HC] * factor * scale0 + base[:HC]) + eps for one token's mixing row: [HC]."""
    o_j = tl.arange(0, HC)
    return tl.sigmoid(tl.load(p_row + o_j) * factor * tl.load(p_scale) + tl.load(p_base + o_j)) + eps


@triton.jit
def hc_post_comb(p_row, p_scale, p_base, p_post, p_comb, factor, eps, HC: tl.constexpr, ITERS: tl.constexpr):
    """Store post = 2 sigmoid(...) [HC] and the Sinkhorn comb [HC, HC] of one token's mixing row,
    whose numbers are multiplied by `factor` first (the RMS factor, or 1)."""
    o_j = tl.arange(0, HC)
    b_post = tl.load(p_row + HC + o_j) * factor * tl.load(p_scale + 1) + tl.load(p_base + HC + o_j)  # [HC]
    tl.store(p_post + o_j, 2.0 * tl.sigmoid(b_post))
    o_c = 2 * HC + o_j[:, None] * HC + o_j[None, :]
    b_c = tl.load(p_row + o_c) * factor * tl.load(p_scale + 2) + tl.load(p_base + o_c)  # [HC, HC] rows j, columns k
    b_c = tl.exp(b_c - tl.max(b_c, axis=1)[:, None])
    b_c = b_c / tl.sum(b_c, axis=1)[:, None] + eps
    b_c = b_c / (tl.sum(b_c, axis=0)[None, :] + eps)
    for _ in range(ITERS - 1):
        b_c = b_c / (tl.sum(b_c, axis=1)[:, None] + eps)
        b_c = b_c / (tl.sum(b_c, axis=0)[None, :] + eps)
    tl.store(p_comb + o_j[:, None] * HC + o_j[None, :], b_c)


@triton.jit
def _hc_split_sinkhorn_kernel(p_mix, p_scale, p_base, p_pre, p_post, p_comb, stride_mix, eps,
                              HC: tl.constexpr, ITERS: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    o_j = tl.arange(0, HC)
    p_row = p_mix + i_t * stride_mix
    tl.store(p_pre + i_t * HC + o_j, hc_pre_gate(p_row, p_scale, p_base, 1.0, eps, HC))
    hc_post_comb(p_row, p_scale, p_base, p_post + i_t * HC, p_comb + i_t * HC * HC, 1.0, eps, HC, ITERS)


def hc_split_sinkhorn(mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc: int, iters: int, eps: float):
    """mix: [T, 2hc + hc*hc] fp32 -> pre [T, hc], post [T, hc], comb [T, hc, hc] (doubly stochastic)."""
    if not runs_triton(mix):
        return naive.hc_split_sinkhorn(mix, scale, base, hc, iters, eps)
    assert mix.dtype == torch.float32 and mix.stride(1) == 1 and hc & (hc - 1) == 0, (mix.dtype, hc)
    T = mix.shape[0]
    pre = torch.empty(T, hc, device=mix.device, dtype=torch.float32)
    post = torch.empty(T, hc, device=mix.device, dtype=torch.float32)
    comb = torch.empty(T, hc, hc, device=mix.device, dtype=torch.float32)
    if T:
        _hc_split_sinkhorn_kernel[(T,)](p_mix=mix, p_scale=scale, p_base=base, p_pre=pre, p_post=post, p_comb=comb,
                                        stride_mix=mix.stride(0), eps=eps, HC=hc, ITERS=iters, num_warps=1)
    return pre, post, comb


@triton.jit
def _hc_post_kernel(p_y, p_res, p_post, p_comb, p_out, stride_y, stride_rt, stride_rh, stride_ot, stride_oh,
                    D: tl.constexpr, HC: tl.constexpr, BLOCK_D: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    i_d = tl.program_id(1)
    o_j = tl.arange(0, HC)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < D
    b_y = tl.load(p_y + i_t * stride_y + o_d, mask=m_d, other=0.0).to(tl.float32)  # [BD]
    b_res = tl.load(p_res + i_t * stride_rt + o_j[:, None] * stride_rh + o_d[None, :],
                    mask=m_d[None, :], other=0.0).to(tl.float32)  # [HC, BD] copies j
    b_post = tl.load(p_post + i_t * HC + o_j)  # [HC]
    b_comb = tl.load(p_comb + i_t * HC * HC + o_j[:, None] * HC + o_j[None, :])  # [HC, HC] (j, i)
    b_mixed = tl.sum(b_comb[:, :, None] * b_res[:, None, :], axis=0)  # [HC, BD] copies i
    b_out = b_post[:, None] * b_y[None, :] + b_mixed
    tl.store(p_out + i_t * stride_ot + o_j[:, None] * stride_oh + o_d[None, :],
             b_out.to(p_out.dtype.element_ty), mask=m_d[None, :])


def hc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """y: [T, d], residual: [T, hc, d], post: [T, hc], comb: [T, hc, hc] fp32 -> [T, hc, d] in residual's dtype."""
    if not runs_triton(y):
        return naive.hc_post(y, residual, post, comb)
    T, hc, d = residual.shape
    assert y.stride(1) == 1 and residual.stride(2) == 1 and post.is_contiguous() and comb.is_contiguous()
    out = torch.empty_like(residual)
    if T:
        block = min(1024, triton.next_power_of_2(d))
        _hc_post_kernel[(T, triton.cdiv(d, block))](
            p_y=y, p_res=residual, p_post=post, p_comb=comb, p_out=out, stride_y=y.stride(0),
            stride_rt=residual.stride(0), stride_rh=residual.stride(1), stride_ot=out.stride(0), stride_oh=out.stride(1),
            D=d, HC=hc, BLOCK_D=block, num_warps=4,
        )
    return out
