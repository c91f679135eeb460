"""fuse-glue: one Triton launch for each glue region of the decode step.

Each kernel replaces one run of SGLang's eager operations (dsv4opt/workload/glue.py) by a single
launch that reads its inputs once and writes its outputs once, in fp32 with one rounding at the
end. The glue slots (hc_split_sum, moe_local; contracts in dsv4opt/workload/slots.py) get one
kernel each; the routed-experts slot keeps SGLang's two per-slot GEMVs with its set-up, activation
and combine fused. Bytes and launches: docs/optimizations/fuse_glue.md. Kernel names stay clear of
the words the classifier reads as MoE, GEMM or attention, so a fused region is still glue in every
profile. Outside the interpreter a CPU runs the plain-torch definitions (kernels/naive.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import approx_reciprocal, interpreted, runs_triton
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.kernels.mhc import hc_pre_gate
from dsv4opt.workload.kernels.moe import mxfp4_slot_gemv, silu_mul_clamp
from dsv4opt.workload.weights import Mxfp4Experts

SLOT_BLOCK = 256  # slots per program of the routing kernels
MAX_BLOCK_D = 1024  # columns per program of the row kernels
SUM_BLOCK_D = 512  # columns per one-warp program of the pre-mix sum
SINKHORN_TOKENS = 32  # tokens per one-warp Sinkhorn program of the pre-mix split


@triton.jit
def _scale_rows(c, eps, HC: tl.constexpr, EMULATE: tl.constexpr):
    """Each row j of the HC x HC matrix c (a tuple of HC * HC [BT] tensors, row-major) divided by
    its sum + eps."""
    r = ()
    for j in tl.static_range(HC):
        s = c[j * HC]
        for k in tl.static_range(1, HC):
            s = s + c[j * HC + k]
        r = r + (approx_reciprocal(s + eps, EMULATE),)
    out = ()
    for e in tl.static_range(HC * HC):
        out = out + (c[e] * r[e // HC],)
    return out


@triton.jit
def _scale_cols(c, eps, HC: tl.constexpr, EMULATE: tl.constexpr):
    """Each column k of c (as in _scale_rows) divided by its sum + eps."""
    r = ()
    for k in tl.static_range(HC):
        s = c[k]
        for j in tl.static_range(1, HC):
            s = s + c[j * HC + k]
        r = r + (approx_reciprocal(s + eps, EMULATE),)
    out = ()
    for e in tl.static_range(HC * HC):
        out = out + (c[e] * r[e % HC],)
    return out


@triton.jit
def _sinkhorn_tokens(p_mix, p_rsqrt, p_scale, p_base, p_post, p_comb, o_t, m_t, stride_mix, eps,
                     HC: tl.constexpr, ITERS: tl.constexpr, EMULATE: tl.constexpr):
    """post [HC] and the Sinkhorn comb [HC, HC] of tokens o_t [BT], one token a lane, each
    token's numbers times its RMS factor. A lane holds its token's whole matrix in registers (a
    tuple of HC * HC values), so the 2 * ITERS dependent normalisations exchange nothing between
    lanes, and each divides once per row or column instead of once per element, by an approximate
    reciprocal: the chain is latency, about 100 ns an iteration on the H200 with full-range
    divisions (benchmarks/probe_hc_split_sum.py)."""
    p_row = p_mix + o_t * stride_mix  # [BT]
    b_r = tl.load(p_rsqrt + o_t, mask=m_t, other=1.0)  # [BT]
    for j in tl.static_range(HC):
        b_post = tl.load(p_row + HC + j, mask=m_t, other=0.0) * b_r * tl.load(p_scale + 1) + tl.load(p_base + HC + j)
        tl.store(p_post + o_t * HC + j, 2.0 * tl.sigmoid(b_post), mask=m_t)
    c = ()  # rows j, columns k
    for e in tl.static_range(HC * HC):
        b_c = tl.load(p_row + 2 * HC + e, mask=m_t, other=0.0) * b_r * tl.load(p_scale + 2)
        c = c + (b_c + tl.load(p_base + 2 * HC + e),)
    top = ()  # each row's max, for the softmax
    for j in tl.static_range(HC):
        b_m = c[j * HC]
        for k in tl.static_range(1, HC):
            b_m = tl.maximum(b_m, c[j * HC + k])
        top = top + (b_m,)
    x = ()
    for e in tl.static_range(HC * HC):
        x = x + (tl.exp(c[e] - top[e // HC]),)
    c = _scale_rows(x, 0.0, HC, EMULATE)
    x = ()
    for e in tl.static_range(HC * HC):
        x = x + (c[e] + eps,)
    c = _scale_cols(x, eps, HC, EMULATE)
    for _ in range(ITERS - 1):
        c = _scale_cols(_scale_rows(c, eps, HC, EMULATE), eps, HC, EMULATE)
    for e in tl.static_range(HC * HC):
        tl.store(p_comb + o_t * (HC * HC) + e, c[e], mask=m_t)


@triton.jit
def _hc_split_sum_kernel(p_mix, p_rsqrt, p_flat, p_scale, p_base, p_x, p_post, p_comb,
                         T, stride_mix, stride_flat, stride_x, eps,
                         D: tl.constexpr, HC: tl.constexpr, ITERS: tl.constexpr, BLOCK_D: tl.constexpr,
                         N_D: tl.constexpr, BLOCK_T: tl.constexpr, EMULATE: tl.constexpr):
    # The first programs run the Sinkhorn iterations for BLOCK_T tokens each: their dependent chain
    # sets the kernel's time, so they start first. The rest sum one token's copies over one block
    # of columns each (pre needs no Sinkhorn), never waiting for them.
    i_p = tl.program_id(0)
    n_sinkhorn = tl.cdiv(T, BLOCK_T)
    if i_p < n_sinkhorn:
        o_t = (i_p * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        _sinkhorn_tokens(p_mix, p_rsqrt, p_scale, p_base, p_post, p_comb, o_t, o_t < T, stride_mix, eps, HC, ITERS,
                         EMULATE)
    else:
        i_t = ((i_p - n_sinkhorn) // N_D).to(tl.int64)
        i_d = (i_p - n_sinkhorn) % N_D
        p_row = p_mix + i_t * stride_mix
        b_pre = hc_pre_gate(p_row, p_scale, p_base, tl.load(p_rsqrt + i_t), eps, HC)  # [HC]
        o_j = tl.arange(0, HC)
        o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
        m_d = o_d < D
        b_f = tl.load(p_flat + i_t * stride_flat + o_j[:, None] * D + o_d[None, :], mask=m_d[None, :],
                      other=0.0)  # [HC, BD] the copies
        b_x = tl.sum(b_pre[:, None] * b_f, axis=0)  # [BD]
        tl.store(p_x + i_t * stride_x + o_d, b_x.to(p_x.dtype.element_ty), mask=m_d)


def hc_split_sum(mix: torch.Tensor, rsqrt: torch.Tensor, flat: torch.Tensor, scale: torch.Tensor,
                 base: torch.Tensor, hc: int, iters: int, eps: float, dtype: torch.dtype):
    """The `hc_split_sum` slot in one launch. mix: [T, 2hc + hc*hc] fp32; rsqrt: [T] fp32;
    flat: [T, hc*d] fp32 -> x [T, d] in `dtype`, post [T, hc] fp32, comb [T, hc, hc] fp32."""
    if not runs_triton(flat):
        return naive.hc_split_sum(mix, rsqrt, flat, scale, base, hc, iters, eps, dtype)
    T, K = flat.shape
    d = K // hc
    assert mix.dtype == flat.dtype == torch.float32 and mix.stride(1) == 1 and flat.is_contiguous(), (mix.dtype, flat.dtype)
    assert hc & (hc - 1) == 0 and K == hc * d and mix.shape == (T, 2 * hc + hc * hc), (hc, K, tuple(mix.shape))
    x = torch.empty(T, d, device=flat.device, dtype=dtype)
    post = torch.empty(T, hc, device=flat.device, dtype=torch.float32)
    comb = torch.empty(T, hc, hc, device=flat.device, dtype=torch.float32)
    if T:
        block = min(SUM_BLOCK_D, triton.next_power_of_2(d))
        n_d = triton.cdiv(d, block)
        # One warp a program: 2 or 4 warps were no faster on the H200 (benchmarks/probe_hc_split_sum.py).
        _hc_split_sum_kernel[(triton.cdiv(T, SINKHORN_TOKENS) + T * n_d,)](
            p_mix=mix, p_rsqrt=rsqrt, p_flat=flat, p_scale=scale, p_base=base, p_x=x, p_post=post, p_comb=comb,
            T=T, stride_mix=mix.stride(0), stride_flat=flat.stride(0), stride_x=x.stride(0), eps=eps,
            D=d, HC=hc, ITERS=iters, BLOCK_D=block, N_D=n_d, BLOCK_T=SINKHORN_TOKENS, EMULATE=interpreted(), num_warps=1,
        )
    return x, post, comb


@triton.jit
def _local_set_gather_kernel(p_ids, p_owner, p_rank, p_local, S, stride_owner, K: tl.constexpr, BLOCK: tl.constexpr):
    o_s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] slots
    m_s = o_s < S
    b_e = tl.load(p_ids + o_s, mask=m_s, other=0).to(tl.int64)  # global expert of each slot
    b_r = tl.load(p_rank + o_s // K, mask=m_s, other=0).to(tl.int64)
    tl.store(p_local + o_s, tl.load(p_owner + b_r * stride_owner + b_e, mask=m_s, other=0), mask=m_s)


def moe_local(ids: torch.Tensor, owner: torch.Tensor, row_rank: torch.Tensor) -> torch.Tensor:
    """The `moe_local` slot in one launch. ids: [M, k] int32; owner: [EP, E] int32; row_rank: [M]
    -> [M, k] in owner's dtype."""
    if not runs_triton(ids):
        return naive.moe_local(ids, owner, row_rank)
    M, k = ids.shape
    assert ids.is_contiguous() and owner.stride(1) == 1 and row_rank.is_contiguous(), "contiguous routing inputs"
    local = torch.empty(M, k, device=ids.device, dtype=owner.dtype)
    if M * k:
        _local_set_gather_kernel[(triton.cdiv(M * k, SLOT_BLOCK),)](
            p_ids=ids, p_owner=owner, p_rank=row_rank, p_local=local, S=M * k, stride_owner=owner.stride(0),
            K=k, BLOCK=SLOT_BLOCK, num_warps=4,
        )
    return local


@triton.jit
def _slot_setup_kernel(p_local, p_experts, p_rows, p_invalid, p_slots, S, K: tl.constexpr, BLOCK: tl.constexpr):
    o_s = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] slots
    m_s = o_s < S
    b_loc = tl.load(p_local + o_s, mask=m_s, other=0)  # local set, -1: another rank's expert
    tl.store(p_experts + o_s, tl.maximum(b_loc, 0).to(p_experts.dtype.element_ty), mask=m_s)
    tl.store(p_rows + o_s, (o_s // K).to(tl.int32), mask=m_s)
    tl.store(p_invalid + o_s, (b_loc < 0).to(tl.uint8), mask=m_s)
    tl.store(p_slots + o_s, o_s.to(tl.int32), mask=m_s)


def moe_slots(local_ids: torch.Tensor):
    """The per-slot path's set-up in one launch. local_ids: [M, k] -> experts (its dtype), rows,
    invalid (bool) and slot numbers, each [M*k]."""
    if not runs_triton(local_ids):
        return naive.moe_slots(local_ids)
    M, k = local_ids.shape
    assert local_ids.is_contiguous(), "contiguous local_ids"
    S = M * k
    experts = torch.empty(S, device=local_ids.device, dtype=local_ids.dtype)
    rows = torch.empty(S, device=local_ids.device, dtype=torch.int32)
    invalid = torch.empty(S, device=local_ids.device, dtype=torch.bool)
    slots = torch.empty(S, device=local_ids.device, dtype=torch.int32)
    if S:
        _slot_setup_kernel[(triton.cdiv(S, SLOT_BLOCK),)](
            p_local=local_ids, p_experts=experts, p_rows=rows, p_invalid=invalid.view(torch.uint8), p_slots=slots,
            S=S, K=k, BLOCK=SLOT_BLOCK, num_warps=4,
        )
    return experts, rows, invalid, slots


@triton.jit
def _combine_reduce_kernel(p_down, p_invalid, p_gates, p_out, stride_down, stride_out, scale,
                           D: tl.constexpr, K: tl.constexpr, K_P: tl.constexpr, BLOCK_D: tl.constexpr):
    i_m = tl.program_id(0).to(tl.int64)
    o_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < D
    o_k = tl.arange(0, K_P)
    o_slot = i_m * K + o_k  # [K_P] this row's slots
    b_keep = (o_k < K) & (tl.load(p_invalid + o_slot, mask=o_k < K, other=1) == 0)  # [K_P]
    b_w = tl.load(p_gates + o_slot, mask=b_keep, other=0.0)  # [K_P] fp32
    # Slots of experts on other ranks are never read: zero whatever their GEMV wrote.
    b_down = tl.load(p_down + o_slot[:, None] * stride_down + o_d[None, :], mask=b_keep[:, None] & m_d[None, :],
                     other=0.0).to(tl.float32)  # [K_P, BD]
    b_sum = tl.sum(b_w[:, None] * b_down, axis=0)  # [BD]
    tl.store(p_out + i_m * stride_out + o_d, (scale * b_sum).to(p_out.dtype.element_ty), mask=m_d)


def moe_combine(down: torch.Tensor, invalid: torch.Tensor, gates: torch.Tensor, scale: float) -> torch.Tensor:
    """The per-slot path's combine in one launch. down: [M*k, d]; invalid: [M*k] bool; gates: [M, k]
    fp32 -> [M, d] in down's dtype = scale * the gated sum of each row's slots on this rank."""
    if not runs_triton(down):
        return naive.moe_combine(down, invalid, gates, scale)
    M, k = gates.shape
    d = down.shape[1]
    assert down.shape[0] == M * k and invalid.shape == (M * k,), (tuple(down.shape), tuple(invalid.shape))
    assert down.stride(1) == 1 and gates.is_contiguous() and gates.dtype == torch.float32
    out = torch.empty(M, d, device=down.device, dtype=down.dtype)
    if M and d:
        block = min(MAX_BLOCK_D, triton.next_power_of_2(d))
        _combine_reduce_kernel[(M, triton.cdiv(d, block))](
            p_down=down, p_invalid=invalid.view(torch.uint8), p_gates=gates, p_out=out,
            stride_down=down.stride(0), stride_out=out.stride(0), scale=scale,
            D=d, K=k, K_P=triton.next_power_of_2(k), BLOCK_D=block, num_warps=4,
        )
    return out


def routed_experts(x: torch.Tensor, local_ids: torch.Tensor, gates: torch.Tensor, w13: Mxfp4Experts,
                   w2: Mxfp4Experts, limit: float, scale: float) -> torch.Tensor:
    """The `routed_experts` slot on SGLang's two per-slot GEMV kernels, the glue around them in three
    launches: the set-up, the clamped SwiGLU (the shared expert's kernel), the combine."""
    experts, rows, invalid, slots = moe_slots(local_ids)
    inter = mxfp4_slot_gemv(x, rows, experts, w13.packed, w13.scales)
    act = silu_mul_clamp(inter, limit)
    down = mxfp4_slot_gemv(act, slots, experts, w2.packed, w2.scales)
    return moe_combine(down, invalid, gates.contiguous(), scale)


IMPLEMENTATIONS = {
    "hc_split_sum": hc_split_sum,
    "moe_local": moe_local,
    "routed_experts": routed_experts,
}
