"""Grouped MXFP4 routed experts: each local expert's slots once, on tensor cores, other ranks' skipped.

Stands in for the `routed_experts` slot (SGLang's `mxfp4_moe_forward_triton`, which runs one
CUDA-core GEMV per (token, expert) slot of every gathered token, other ranks' slots clamped to local
expert 0, computed and zeroed). Here the slots on this rank are sorted by expert into tiles of
BM rows (vLLM/SGLang's `moe_align_block_size` idea, with torch operations of fixed shapes so the
step stays CUDA-graph safe), and two grouped GEMM kernels read each expert's MXFP4 weights once per
tile of its tokens, dequantise them in registers and multiply on tensor cores: gate/up with the
clamped SwiGLU fused in, then down; a last kernel sums each token's top-k rows with their gates.
Maths and bytes: docs/optimizations/grouped_moe.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import dot_dtype_ok, runs_triton
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.quant import MXFP4_GROUP
from dsv4opt.workload.weights import Mxfp4Experts

BLOCK_M = 16  # slots per tile: the smallest tl.dot M; about 6 tokens per expert at C = 32


@triton.jit
def _e2m1(nib):
    """A 4-bit e2m1 code (sign, two exponent bits, one mantissa bit) -> fp32, without exp2 (the
    special-function unit runs at a quarter of the rate of the integer and FMA pipes)."""
    exp = (nib >> 1) & 3
    man = (nib & 1).to(tl.float32)
    pow2 = (1 << tl.maximum(exp - 1, 0)).to(tl.float32)  # 2^(exp - 1) for exp >= 1
    mag = tl.where(exp == 0, man * 0.5, (1.0 + man * 0.5) * pow2)
    return tl.where((nib & 8) != 0, -mag, mag)


@triton.jit
def _mxfp4_tile(p_w, p_s, e, o_n, m_n, k0, stride_we, stride_wn, stride_se, stride_sn,
                K: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, dt: tl.constexpr):
    """Rows o_n, columns [k0, k0 + BK) of expert e's weights, dequantised: [BN, BK] in dt."""
    BN: tl.constexpr = o_n.shape[0]
    G: tl.constexpr = BK // GROUP  # scale groups in the tile
    o_b = k0 // 2 + tl.arange(0, BK // 2)  # byte columns: two values each
    m_w = m_n[:, None] & (o_b[None, :] < K // 2)
    b_w = tl.load(p_w + e * stride_we + o_n[:, None] * stride_wn + o_b[None, :], mask=m_w, other=0).to(tl.int32)
    o_g = k0 // GROUP + tl.arange(0, G)
    b_s = tl.load(p_s + e * stride_se + o_n[:, None] * stride_sn + o_g[None, :],
                  mask=m_n[:, None] & (o_g < K // GROUP)[None, :], other=0.0)  # [BN, G]: one load per group
    b_s = tl.reshape(tl.broadcast_to(b_s[:, :, None], [BN, G, GROUP // 2]), [BN, BK // 2])  # per byte
    b_lo = _e2m1(b_w & 0xF) * b_s  # [BN, BK/2] even columns
    b_hi = _e2m1((b_w >> 4) & 0xF) * b_s  # odd columns
    return tl.reshape(tl.join(b_lo, b_hi), [BN, BK]).to(dt)  # [BN, BK] in column order


@triton.jit
def _moe_gate_up_kernel(p_x, p_w, p_s, p_rows, p_tile_expert, p_act,
                    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_am, limit,
                    R, I: tl.constexpr, K: tl.constexpr, TOPK: tl.constexpr, GROUP: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Tile i_t (BM slots of one expert) x columns [i_n*BN, +BN) of the activation:
    act = silu(min(x W_gate^T, limit)) * clamp(x W_up^T, -limit, limit), in x's dtype."""
    i_t = tl.program_id(0)
    i_n = tl.program_id(1)
    e = tl.load(p_tile_expert + i_t).to(tl.int64)
    if e < R:  # tiles past the last expert's are empty
        o_m = i_t * BM + tl.arange(0, BM)
        slot = tl.load(p_rows + o_m)  # [BM] slot numbers, -1 for padding
        m_m = slot >= 0
        row = tl.where(m_m, slot // TOPK, 0).to(tl.int64)  # the token each slot routes
        o_n = i_n * BN + tl.arange(0, BN)
        m_n = o_n < I
        o_k = tl.arange(0, BK)
        b_g = tl.zeros([BM, BN], tl.float32)  # [BM, BN]
        b_u = tl.zeros([BM, BN], tl.float32)
        dt = p_x.dtype.element_ty
        for k0 in range(0, K, BK):
            b_x = tl.load(p_x + row[:, None] * stride_xm + (k0 + o_k)[None, :],
                          mask=m_m[:, None] & ((k0 + o_k) < K)[None, :], other=0.0)  # [BM, BK]
            w_g = _mxfp4_tile(p_w, p_s, e, o_n, m_n, k0, stride_we, stride_wn, stride_se, stride_sn, K, BK, GROUP, dt)
            w_u = _mxfp4_tile(p_w, p_s, e, I + o_n, m_n, k0, stride_we, stride_wn, stride_se, stride_sn, K, BK, GROUP, dt)
            b_g = tl.dot(b_x, tl.trans(w_g), acc=b_g)
            b_u = tl.dot(b_x, tl.trans(w_u), acc=b_u)
        b_g = tl.minimum(b_g, limit)
        b_u = tl.minimum(tl.maximum(b_u, -limit), limit)
        b_a = b_g * tl.sigmoid(b_g) * b_u
        tl.store(p_act + o_m.to(tl.int64)[:, None] * stride_am + o_n[None, :], b_a.to(p_act.dtype.element_ty),
                 mask=m_m[:, None] & m_n[None, :])


@triton.jit
def _moe_down_kernel(p_act, p_w, p_s, p_rows, p_tile_expert, p_out,
                 stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_om,
                 R, N: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Tile i_t x output columns [i_n*BN, +BN): out[slot] = act[tile row] W_down^T (fp32), per slot."""
    i_t = tl.program_id(0)
    i_n = tl.program_id(1)
    e = tl.load(p_tile_expert + i_t).to(tl.int64)
    if e < R:
        o_m = i_t * BM + tl.arange(0, BM)
        slot = tl.load(p_rows + o_m)
        m_m = slot >= 0
        o_n = i_n * BN + tl.arange(0, BN)
        m_n = o_n < N
        o_k = tl.arange(0, BK)
        b_o = tl.zeros([BM, BN], tl.float32)
        dt = p_act.dtype.element_ty
        for k0 in range(0, K, BK):
            b_a = tl.load(p_act + o_m.to(tl.int64)[:, None] * stride_am + (k0 + o_k)[None, :],
                          mask=m_m[:, None] & ((k0 + o_k) < K)[None, :], other=0.0)  # [BM, BK]
            w_d = _mxfp4_tile(p_w, p_s, e, o_n, m_n, k0, stride_we, stride_wn, stride_se, stride_sn, K, BK, GROUP, dt)
            b_o = tl.dot(b_a, tl.trans(w_d), acc=b_o)
        o_s = tl.where(m_m, slot, 0).to(tl.int64)
        tl.store(p_out + o_s[:, None] * stride_om + o_n[None, :], b_o, mask=m_m[:, None] & m_n[None, :])


@triton.jit
def _moe_combine_kernel(p_down, p_ids, p_gates, p_out, stride_dm, stride_om, scale,
                    N: tl.constexpr, TOPK: tl.constexpr, BN: tl.constexpr):
    """out[m] = scale * sum_j gates[m, j] * down[m * TOPK + j] over the slots on this rank."""
    i_m = tl.program_id(0).to(tl.int64)
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    m_n = o_n < N
    b_o = tl.zeros([BN], tl.float32)
    for j in tl.static_range(TOPK):
        at = i_m * TOPK + j + o_n * 0  # [BN] the same slot: a vector, since the interpreter refuses a scalar mask
        ok = tl.load(p_ids + at) >= 0
        g = tl.load(p_gates + at)
        # rows of other ranks' slots were never written: select, do not multiply
        b_d = tl.load(p_down + (i_m * TOPK + j) * stride_dm + o_n, mask=m_n & ok, other=0.0)
        b_o += tl.where(ok, g, 0.0) * b_d
    tl.store(p_out + i_m * stride_om + o_n, (b_o * scale).to(p_out.dtype.element_ty), mask=m_n)


@dataclass(frozen=True)
class Routing:
    """Slots sorted by local expert into tiles of BLOCK_M rows: rows [P] slot numbers (-1: padding),
    tile_expert [P / BLOCK_M] (R: an empty tile past the last expert's)."""

    rows: torch.Tensor
    tile_expert: torch.Tensor


@triton.jit
def _route_kernel(p_ids, p_rows, p_tile_expert, S, R, P, T,
                  BM: tl.constexpr, R_P: tl.constexpr, CH: tl.constexpr):
    """One program: the routing of `route_torch` in one launch (its ~20 torch launches a layer
    were the top glue region of the grouped-moe profile at C = 32). Slots go by chunks of CH; a
    slot's place among its expert's slots is its chunk's exclusive one-hot prefix sum plus the
    counts of the chunks before it, which keeps slot order within an expert without a sort."""
    o_e = tl.arange(0, R_P)
    counts = tl.zeros([R_P], dtype=tl.int32)
    for c in range(0, tl.cdiv(S, CH)):
        o_s = c * CH + tl.arange(0, CH)
        ids = tl.load(p_ids + o_s, mask=o_s < S, other=-1)
        key = tl.where(o_s < S, tl.where(ids >= 0, ids, R), R_P)  # R: another rank's; R_P: past the end
        counts += tl.sum((key[:, None] == o_e[None, :]).to(tl.int32), axis=0)
    tiles = tl.where(o_e < R, (counts + BM - 1) // BM, 0)
    end = tl.cumsum(tiles, 0) * BM  # one past each expert's padded rows
    start = end - tiles * BM
    for r0 in range(0, P, CH):
        o_r = r0 + tl.arange(0, CH)
        tl.store(p_rows + o_r, tl.full([CH], -1, tl.int32), mask=o_r < P)
    for t0 in range(0, T, CH):
        o_t = t0 + tl.arange(0, CH)
        # searchsorted(end, tile start, right=True): the experts whose rows end at or before it
        below = (end[None, :] <= (o_t * BM)[:, None]) & (o_e < R)[None, :]
        tl.store(p_tile_expert + o_t, tl.sum(below.to(tl.int32), axis=1), mask=o_t < T)
    tl.debug_barrier()  # the -1 fill lands before the slots are scattered over it
    carry = tl.zeros([R_P], dtype=tl.int32)
    for c in range(0, tl.cdiv(S, CH)):
        o_s = c * CH + tl.arange(0, CH)
        ids = tl.load(p_ids + o_s, mask=o_s < S, other=-1)
        key = tl.where(o_s < S, tl.where(ids >= 0, ids, R), R_P)
        hot = (key[:, None] == o_e[None, :]).to(tl.int32)  # [CH, R_P]
        before = tl.cumsum(hot, 0) - hot  # this expert's slots earlier in the chunk
        dest = tl.sum(hot * (before + carry[None, :] + start[None, :]), axis=1)
        tl.store(p_rows + dest, o_s.to(tl.int32), mask=(o_s < S) & (key < R))
        carry += tl.sum(hot, axis=0)


def _route_chunk(r_p: int) -> int:
    """Slots per chunk: the [chunk, experts] one-hot at 4096 values (32 registers a thread at 4 warps)."""
    return max(16, min(128, 4096 // r_p))


def route(local_ids: torch.Tensor, experts: int, block_m: int = BLOCK_M) -> Routing:
    """Group the slots of `local_ids` [M, k] by expert, dropping -1 (other ranks'): fixed shapes, no
    host synchronisation. Expert e's slots fill rows [start_e, start_e + count_e) in slot order,
    start_e the sum of the earlier experts' counts rounded up to whole tiles. One Triton launch
    where Triton runs, else `route_torch` (the reference its test holds it to, exactly)."""
    flat = local_ids.reshape(-1)
    if not runs_triton(flat) or flat.numel() == 0:
        return route_torch(local_ids, experts, block_m)
    S = flat.numel()
    P = (triton.cdiv(S, block_m) + experts) * block_m
    T = P // block_m
    rows = torch.empty(P, dtype=torch.int32, device=flat.device)
    tile_expert = torch.empty(T, dtype=torch.int32, device=flat.device)
    r_p = triton.next_power_of_2(experts + 1)
    _route_kernel[(1,)](flat.to(torch.int32).contiguous(), rows, tile_expert, S, experts, P, T,
                        BM=block_m, R_P=r_p, CH=_route_chunk(r_p), num_warps=4)
    return Routing(rows, tile_expert)


def route_torch(local_ids: torch.Tensor, experts: int, block_m: int = BLOCK_M) -> Routing:
    """`route` in fixed-shape torch operations (about 20 launches on a GPU)."""
    flat = local_ids.reshape(-1)
    S = flat.numel()
    dev = flat.device
    key = torch.where(flat >= 0, flat, experts).long()  # other ranks' slots sort last, as expert R
    counts = torch.zeros(experts + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
    tiles = (counts[:experts] + block_m - 1) // block_m  # [R]
    end = torch.cumsum(tiles, 0) * block_m  # [R] one past each expert's padded rows
    start = end - tiles * block_m
    P = (triton.cdiv(S, block_m) + experts) * block_m  # at most S + R * (BLOCK_M - 1) rows, rounded up
    order = torch.argsort(key, stable=True)
    key_sorted = key[order]
    first = torch.cumsum(counts, 0) - counts  # where each expert's slots begin in sorted order
    dest = torch.cat([start, start.new_full((1,), P)])[key_sorted] + torch.arange(S, device=dev) - first[key_sorted]
    rows = torch.full((P + 1,), -1, dtype=torch.int32, device=dev)  # row P collects the dropped slots
    rows.scatter_(0, torch.where(key_sorted < experts, dest, P), order.to(torch.int32))
    tile_start = torch.arange(0, P, block_m, device=dev)
    tile_expert = torch.searchsorted(end, tile_start, right=True).to(torch.int32)
    return Routing(rows[:P], tile_expert)


@dataclass(frozen=True)
class MoeTiles:
    """Launch configuration of the two GEMM kernels: output columns (BN) and input columns (BK, whole
    MXFP4 groups) per program, warps and pipeline stages."""

    up_bn: int = 64
    up_bk: int = 128
    up_warps: int = 4
    up_stages: int = 3
    down_bn: int = 64
    down_bk: int = 128
    down_warps: int = 4
    down_stages: int = 3


# Few gathered tokens (C <= 8 a rank) hit few experts: narrower column blocks give those tiles more
# programs (measured on the H200 at C = 1: 265 against 405 µs; at C = 32 the default is faster).
SMALL_TILES = MoeTiles(up_bn=32, down_bn=32)
SMALL_TOKENS = 64


def _fit(block: int, n: int) -> int:
    """A power-of-two block no wider than n needs."""
    return min(block, triton.next_power_of_2(n))


def grouped_routed_experts(x: torch.Tensor, local_ids: torch.Tensor, gates: torch.Tensor, w13: Mxfp4Experts,
                           w2: Mxfp4Experts, limit: float, scale: float, tiles: MoeTiles | None = None) -> torch.Tensor:
    """The `routed_experts` slot (dsv4opt/workload/slots.py), grouped by expert on tensor cores.

    x: [M, d]; local_ids: [M, k] int32 (-1: another rank's expert); gates: [M, k] fp32;
    w13: [R, 2I, d], w2: [R, d, I] MXFP4 -> [M, d] in x's dtype. CUDA-graph safe. Where Triton
    cannot run (a CPU without the interpreter) the same grouping in plain torch, expert by expert.
    """
    if not (runs_triton(x) and dot_dtype_ok(x.dtype)):
        return naive.routed_experts(x, local_ids, gates, w13, w2, limit, scale)
    M, d = x.shape
    k = local_ids.shape[1]
    R, two_i, K13 = w13.packed.shape
    I = two_i // 2
    assert K13 * 2 == d and w2.packed.shape == (R, d, I // 2) and d % MXFP4_GROUP == 0 and I % MXFP4_GROUP == 0
    assert x.stride(1) == 1 and local_ids.is_contiguous() and gates.is_contiguous()
    r = route(local_ids.to(torch.int32), R)
    P = r.rows.numel()
    act = torch.empty(P, I, device=x.device, dtype=x.dtype)
    down = torch.empty(M * k, d, device=x.device, dtype=torch.float32)
    out = torch.empty(M, d, device=x.device, dtype=x.dtype)
    n_tiles = P // BLOCK_M
    t = tiles or (SMALL_TILES if M <= SMALL_TOKENS else MoeTiles())
    if M:
        bn, bk = _fit(t.up_bn, I), _fit(t.up_bk, d)
        _moe_gate_up_kernel[(n_tiles, triton.cdiv(I, bn))](
            p_x=x, p_w=w13.packed, p_s=w13.scales, p_rows=r.rows, p_tile_expert=r.tile_expert, p_act=act,
            stride_xm=x.stride(0), stride_we=w13.packed.stride(0), stride_wn=w13.packed.stride(1),
            stride_se=w13.scales.stride(0), stride_sn=w13.scales.stride(1), stride_am=act.stride(0), limit=limit,
            R=R, I=I, K=d, TOPK=k, GROUP=MXFP4_GROUP, BM=BLOCK_M, BN=bn, BK=bk,
            num_warps=t.up_warps, num_stages=t.up_stages,
        )
        bn, bk = _fit(t.down_bn, d), _fit(t.down_bk, I)
        _moe_down_kernel[(n_tiles, triton.cdiv(d, bn))](
            p_act=act, p_w=w2.packed, p_s=w2.scales, p_rows=r.rows, p_tile_expert=r.tile_expert, p_out=down,
            stride_am=act.stride(0), stride_we=w2.packed.stride(0), stride_wn=w2.packed.stride(1),
            stride_se=w2.scales.stride(0), stride_sn=w2.scales.stride(1), stride_om=down.stride(0),
            R=R, N=d, K=I, GROUP=MXFP4_GROUP, BM=BLOCK_M, BN=bn, BK=bk,
            num_warps=t.down_warps, num_stages=t.down_stages,
        )
        bc = min(1024, triton.next_power_of_2(d))
        _moe_combine_kernel[(M, triton.cdiv(d, bc))](
            p_down=down, p_ids=local_ids, p_gates=gates, p_out=out, stride_dm=down.stride(0), stride_om=out.stride(0),
            scale=scale, N=d, TOPK=k, BN=bc, num_warps=4,
        )
    return out
