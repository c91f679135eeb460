"""Routed experts as SGLang's sm_120 MXFP4 fallback runs them: one GEMV per (token, expert) slot.

`mxfp4_slot_gemv` stands for `_mxfp4_slot_gemv_kernel` (fused_moe_triton/mxfp4_moe_sm120_triton.py,
reached through mxfp4_marlin_moe.py:117-146 on sm_120): each program decodes a BLOCK_N x BLOCK_K
tile of its slot's expert weights from e2m1 nibbles and fp32 group scales and multiplies it with
the slot's activation row on CUDA cores; no token sort, no tensor cores. Every slot re-reads its
expert's weights.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import interpreted, runs_triton
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.quant import MXFP4_GROUP


@triton.jit
def _e2m1_to_f32(nib):
    """A 4-bit e2m1 code (sign, two exponent bits, one mantissa bit) -> fp32."""
    sign = (nib >> 3) & 1
    exp = (nib >> 1) & 3
    man = (nib & 1).to(tl.float32)
    mag = tl.where(exp == 0, man * 0.5, (1.0 + man * 0.5) * tl.exp2((exp - 1).to(tl.float32)))
    return tl.where(sign != 0, -mag, mag)


@triton.jit
def _mxfp4_slot_gemv_kernel(p_a, p_w, p_s, p_c, p_rows, p_experts,
                            stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_cm,
                            N: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    i_slot = tl.program_id(0)
    i_n = tl.program_id(1)
    row = tl.load(p_rows + i_slot).to(tl.int64)
    expert = tl.load(p_experts + i_slot).to(tl.int64)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    o_h = tl.arange(0, BLOCK_K // 2)  # byte columns of the tile: two values each
    b_acc = tl.zeros([BLOCK_N], tl.float32)  # [BN]
    for k0 in range(0, K, BLOCK_K):
        o_byte = k0 // 2 + o_h
        m_w = m_n[:, None] & (o_byte[None, :] < K // 2)
        b_w = tl.load(p_w + expert * stride_we + o_n[:, None] * stride_wn + o_byte[None, :], mask=m_w, other=0)
        b_w = b_w.to(tl.int32)  # [BN, BK/2] packed bytes
        b_s = tl.load(p_s + expert * stride_se + o_n[:, None] * stride_sn + (2 * o_byte[None, :]) // GROUP,
                      mask=m_w, other=0.0)  # [BN, BK/2] the group scale of both values of each byte
        b_lo = _e2m1_to_f32(b_w & 0xF) * b_s  # even k
        b_hi = _e2m1_to_f32((b_w >> 4) & 0xF) * b_s  # odd k
        o_even = k0 + 2 * o_h
        b_a0 = tl.load(p_a + row * stride_am + o_even, mask=o_even < K, other=0.0).to(tl.float32)  # [BK/2]
        b_a1 = tl.load(p_a + row * stride_am + o_even + 1, mask=o_even + 1 < K, other=0.0).to(tl.float32)
        b_acc += tl.sum(b_lo * b_a0[None, :], axis=1) + tl.sum(b_hi * b_a1[None, :], axis=1)
    tl.store(p_c + i_slot * stride_cm + o_n, b_acc.to(p_c.dtype.element_ty), mask=m_n)


def mxfp4_slot_gemv(a: torch.Tensor, rows: torch.Tensor, experts: torch.Tensor,
                    w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """out[s] = a[rows[s]] @ dequant(w[experts[s]])^T for each slot s.

    a: [M, K] (model dtype); rows, experts: [S] int32; w: [E, N, K/2] uint8; w_scale: [E, N, K/32]
    fp32 -> [S, N] in a's dtype.
    """
    if not runs_triton(a):
        return naive.mxfp4_slot_gemv(a, rows, experts, w, w_scale)
    S = rows.shape[0]
    E, N, K2 = w.shape
    K = 2 * K2
    assert a.shape[1] == K and a.stride(1) == 1 and w.stride(2) == 1 and w_scale.stride(2) == 1
    out = torch.empty(S, N, device=a.device, dtype=a.dtype)
    block_n, block_k = 64, min(128, triton.next_power_of_2(K))
    if interpreted():  # fewer, larger programs: the interpreter pays per program, the GPU per register
        block_n = min(256, triton.next_power_of_2(N))
    if S:
        _mxfp4_slot_gemv_kernel[(S, triton.cdiv(N, block_n))](
            p_a=a, p_w=w, p_s=w_scale, p_c=out, p_rows=rows, p_experts=experts,
            stride_am=a.stride(0), stride_we=w.stride(0), stride_wn=w.stride(1),
            stride_se=w_scale.stride(0), stride_sn=w_scale.stride(1), stride_cm=out.stride(0),
            N=N, K=K, GROUP=MXFP4_GROUP, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4, num_stages=2,
        )
    return out


@triton.jit
def _moe_gate_kernel(p_logits, p_bias, p_tokens, p_table, p_ids, p_weights, stride_l,
                     E: tl.constexpr, E_P: tl.constexpr, TOPK: tl.constexpr, K_P: tl.constexpr, HASH: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    o_e = tl.arange(0, E_P)
    m_e = o_e < E
    b_x = tl.load(p_logits + i_t * stride_l + o_e, mask=m_e, other=0.0)  # [E_P] fp32
    # sqrt(softplus(x)), softplus written to stay finite for large x
    b_s = tl.sqrt(tl.maximum(b_x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(b_x))))  # [E_P]
    o_k = tl.arange(0, K_P)
    b_ids = tl.zeros([K_P], tl.int32)
    b_w = tl.zeros([K_P], tl.float32)
    if HASH:
        tok = tl.load(p_tokens + i_t).to(tl.int64)
        b_ids = tl.load(p_table + tok * TOPK + o_k, mask=o_k < TOPK, other=0).to(tl.int32)  # [K_P]
        b_sel = (o_e[None, :] == b_ids[:, None]) & (o_k[:, None] < TOPK)  # [K_P, E_P]
        b_w = tl.sum(tl.where(b_sel, b_s[None, :], 0.0), axis=1)
    else:
        b_pick = tl.where(m_e, b_s + tl.load(p_bias + o_e, mask=m_e, other=0.0), float("-inf"))  # bias only chooses
        for j in range(TOPK):
            i_best = tl.argmax(b_pick, axis=0)
            b_ids = tl.where(o_k == j, i_best, b_ids)
            b_w = tl.where(o_k == j, tl.sum(tl.where(o_e == i_best, b_s, 0.0), axis=0), b_w)
            b_pick = tl.where(o_e == i_best, float("-inf"), b_pick)
    b_w = b_w / tl.sum(b_w, axis=0)
    tl.store(p_ids + i_t * TOPK + o_k, b_ids, mask=o_k < TOPK)
    tl.store(p_weights + i_t * TOPK + o_k, b_w, mask=o_k < TOPK)


def moe_gate(logits: torch.Tensor, bias: torch.Tensor, topk: int,
             tokens: torch.Tensor | None = None, table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Router scores sqrt(softplus(logits)) -> (ids [M, topk] int32, weights [M, topk] fp32, renormalised).

    Stands for SGLang's JIT `moe_fused_gate` (layers/moe/topk.py:1725-1744; the bias only chooses
    the experts) and, when `table` is given, its `hash_topk` kernel (jit_kernel/dsv4/moe.py:109-148;
    the experts come from table[tokens]). logits: [M, E] fp32; bias: [E] fp32; table: [vocab, topk].
    """
    if not runs_triton(logits):
        return naive.moe_gate(logits, bias, topk, tokens, table)
    M, E = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    ids = torch.empty(M, topk, device=logits.device, dtype=torch.int32)
    weights = torch.empty(M, topk, device=logits.device, dtype=torch.float32)
    hashed = table is not None
    if M:
        _moe_gate_kernel[(M,)](
            p_logits=logits, p_bias=bias, p_tokens=tokens if hashed else logits, p_table=table if hashed else logits,
            p_ids=ids, p_weights=weights, stride_l=logits.stride(0),
            E=E, E_P=triton.next_power_of_2(E), TOPK=topk, K_P=triton.next_power_of_2(topk), HASH=hashed, num_warps=4,
        )
    return ids, weights


@triton.jit
def _silu_mul_clamp_kernel(p_x, p_y, stride_x, stride_y, limit, I: tl.constexpr, BLOCK: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = o < I
    b_g = tl.minimum(tl.load(p_x + i_t * stride_x + o, mask=m, other=0.0), limit).to(tl.float32)
    b_u = tl.clamp(tl.load(p_x + i_t * stride_x + I + o, mask=m, other=0.0), -limit, limit).to(tl.float32)
    tl.store(p_y + i_t * stride_y + o, (b_g * tl.sigmoid(b_g) * b_u).to(p_y.dtype.element_ty), mask=m)


def silu_mul_clamp(x: torch.Tensor, limit: float) -> torch.Tensor:
    """x: [M, 2I] (gate then up) -> silu(min(gate, limit)) * clamp(up, -limit, limit): [M, I].

    Stands for SGLang's JIT `silu_and_mul_clamp` (models/deepseek_v2.py:395-398) of the shared expert.
    """
    if not runs_triton(x):
        return naive.silu_mul_clamp(x, limit)
    M, I2 = x.shape
    I = I2 // 2
    y = torch.empty(M, I, device=x.device, dtype=x.dtype)
    block = min(1024, triton.next_power_of_2(I))
    if M:
        _silu_mul_clamp_kernel[(M, triton.cdiv(I, block))](p_x=x, p_y=y, stride_x=x.stride(0), stride_y=y.stride(0),
                                                           limit=limit, I=I, BLOCK=block, num_warps=4)
    return y
