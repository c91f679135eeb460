"""Grouped MXFP4 routed experts: each local expert's slots once, weights on the tensor core's wide side.

The grouped-moe optimisation's `routed_experts` implementation on the sm_120 path (in place of
SGLang's `mxfp4_moe_forward_triton`: one CUDA-core GEMV per (token, expert) slot), and on the Hopper
path of SGLang 0.5.23 the stand-in for Marlin's W4A16 grouped MoE (SGLang's
`moe_wna16_marlin_gemm`, JIT-compiled with nvcc at run time; dsv4opt/workload/paths.py). Four
launches, fixed shapes, no host synchronisation (CUDA-graph safe):

1. `route` (one program, atomics): the slots on this rank grouped by expert into tiles of BM slots;
   other ranks' slots (-1) dropped; the tile count left on the device.
2. gate/up (`_moe_up_kernel`, persistent): per work item (tile, BN rows of gate and of up, K split),
   the expert's weights in the production layout (`layout.py`) decoded by shifts and
   masks into bf16 pairs with the e8m0 scale folded into one bf16x2 multiply, multiplied as the MMA's A operand
   (BN wide) against the tile's gathered tokens (BM narrow); the clamped SwiGLU in the epilogue, or
   fp32 partial sums when K is split (the down kernel sums them and applies the SwiGLU).
3. down (`_moe_down_kernel`, persistent): the same against w2, fp32 rows per slot (per K split).
4. combine: each token's slots (and splits) summed with their gates.

With slotwise tiles (a config's `slotwise`, tp4 at C = 1) two: each slot is its own tile with its
expert read from the ids (no routing launch), and down's last item a token sums the token's rows
(no combine launch).

Tile choices come from `configs.py`. Maths, bytes and floors:
docs/optimizations/grouped_moe.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv4opt.workload.kernels.grouped_moe.configs import MoeConfig, choose
from dsv4opt.workload.kernels.grouped_moe.direct import DirectTiles, direct_routed_experts, direct_supported, tickets_needed
from dsv4opt.workload.kernels.grouped_moe.ws import ws_down, ws_down_supported, ws_gate_up, ws_runs_on, ws_supported
from dsv4opt.workload.kernels.grouped_moe.layout import (BF16_MANTISSA_BITS, FOLD_EXP_ADD, UNIT_BYTES, UNIT_COLS, UNIT_ROWS,
                                                        UNIT_SCALES, PackedExperts, packed_experts)
from dsv4opt.tritonlib import (DeviceLimits, compile_only, device_limits, dot_dtype_ok, interpreted, runs_triton,
                               sm_count)
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.quant import MXFP4_GROUP
from dsv4opt.workload.weights import Mxfp4Experts

_FOLD_EXP_ADD, _BF16_MANT = tl.constexpr(FOLD_EXP_ADD), tl.constexpr(BF16_MANTISSA_BITS)
_E2M1_BIAS = 2.0**126  # bf16 bits of an e2m1 code placed by shift and mask, times this, are its value


@triton.jit
def _decode_pairs(b_w, b_m, FOLD: tl.constexpr):
    """Four bytes (one word q, 8 values in layout.BITS places) of b_w -> 8 bf16 values as two outputs
    of b_w's shape: pairs q & M, (q << 3) & M, (q << 6) & M (M = 0x81C081C0) and the fourth from
    three shifts, each times its multiplier (b_m: bf16, elements 0-1 for pairs 0 and 2, elements
    2-3 for pairs 1 and 3). 11 integer operations and 4 bf16x2 multiplies a word."""
    if FOLD:
        mul: tl.constexpr = "mul.rn.bf16x2 $0, $0, $5;\nmul.rn.bf16x2 $2, $2, $5;\n" \
                            "mul.rn.bf16x2 $1, $1, $6;\nmul.rn.bf16x2 $3, $3, $6;"
    else:
        mul: tl.constexpr = "mov.b32 b, 0x7E807E80;\n" \
                            "mul.rn.bf16x2 $0, $0, b;\nmul.rn.bf16x2 $2, $2, b;\n" \
                            "mul.rn.bf16x2 $1, $1, b;\nmul.rn.bf16x2 $3, $3, b;\n" \
                            "mul.rn.bf16x2 $0, $0, $5;\nmul.rn.bf16x2 $2, $2, $5;\n" \
                            "mul.rn.bf16x2 $1, $1, $6;\nmul.rn.bf16x2 $3, $3, $6;"
    return tl.inline_asm_elementwise(
        asm="{\n.reg .b32 t, u, v, b;\n"
            "and.b32 $0, $4, 0x81C081C0;\n"
            "shl.b32 t, $4, 3;\nand.b32 $1, t, 0x81C081C0;\n"
            "shl.b32 t, $4, 6;\nand.b32 $2, t, 0x81C081C0;\n"
            "shl.b32 t, $4, 1;\nand.b32 t, t, 0x80008000;\n"
            "shr.b32 u, $4, 3;\nand.b32 u, u, 0x01800180;\n"
            "shr.b32 v, $4, 7;\nand.b32 v, v, 0x00400040;\n"
            "or.b32 t, t, u;\nor.b32 $3, t, v;\n"
            + mul + "\n}",
        constraints="=r,=r,=r,=r,r,r,r",
        args=[b_w, b_m],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _unit_tile(p_w, p_s, rows, m_rows, kb0, K64, U_N: tl.constexpr, U_K: tl.constexpr,
               FOLD: tl.constexpr, EMULATE: tl.constexpr, MASKED: tl.constexpr, dt: tl.constexpr):
    """Unit rows `rows` [U_N] (expert * N16 + row block) x U_K units of columns from unit kb0,
    decoded: [U_N * 16, U_K * 64] in dt, the A operand of tl.dot. Rows where m_rows is false and
    columns past K64 units read as zero."""
    o_kb = tl.arange(0, U_K)[None, :, None, None]
    unit = rows.to(tl.int64)[:, None, None, None] * K64 + kb0 + o_kb  # [U_N, U_K, 1, 1]
    o_l = tl.arange(0, 32)[None, None, :, None]
    p_v = p_w + unit * 512 + o_l * 16 + tl.arange(0, 16)[None, None, None, :]  # [U_N, U_K, 32, 16]
    # 32 scale bytes a unit: a tile of 16 units or more loads 4 bytes a thread, which Triton pipelines
    p_sc = p_s + unit * 32 + tl.arange(0, 8)[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]
    if MASKED:
        m_u = m_rows[:, None, None, None] & (kb0 + o_kb < K64)
        b_w = tl.load(p_v, mask=m_u, other=0)  # [U_N, U_K, 32, 16] uint8
        b_s = tl.load(p_sc, mask=m_u, other=127)  # [U_N, U_K, 8, 4] e8m0: (g, group, row half)
    else:
        b_w = tl.load(p_v)
        b_s = tl.load(p_sc)
    if EMULATE:
        # The same shifts and masks in integer ops, the multiply in fp32 (no inline PTX here).
        b_q = tl.reshape(b_w.to(tl.uint32), [U_N, U_K, 32, 4, 4])
        b_q = tl.sum(b_q << (tl.arange(0, 4) * 8).to(tl.uint32)[None, None, None, None, :], axis=4)  # words
        b_q = b_q[:, :, :, :, None]
        j = tl.arange(0, 4)[None, None, None, None, :]  # [.., s, j]
        b_t = b_q << tl.where(j == 3, 0, 3 * j).to(tl.uint32)
        b_r3 = ((b_q << 1) & 0x80008000) | ((b_q >> 3) & 0x01800180) | ((b_q >> 7) & 0x00400040)
        b_r = tl.where(j == 3, b_r3, b_t & 0x81C081C0)
        b_lo = ((b_r & 0xFFFF) << 16).to(tl.float32, bitcast=True)
        b_hi = (b_r & 0xFFFF0000).to(tl.float32, bitcast=True)
        b_v = tl.join(b_lo, b_hi) * _E2M1_BIAS  # [U_N, U_K, 32, 4(s), 4(j), 2(h)]
        b_v = tl.reshape(b_v, [U_N, U_K, 8, 4, 4, 2, 2, 2])  # g, q, s, w = j >> 1, ih = j & 1, h
        b_v = tl.permute(b_v, (0, 1, 2, 3, 4, 6, 7, 5))  # g, q, s, ih, h, w
        b_m = tl.exp2(b_s.to(tl.float32) - 127.0)
        b_m = tl.broadcast_to(tl.reshape(b_m, [U_N, U_K, 8, 1, 2, 1, 2, 1, 1]), [U_N, U_K, 8, 4, 2, 2, 2, 2, 2])
        b_v = b_v * tl.reshape(b_m, [U_N, U_K, 8, 4, 4, 2, 2, 2])
    else:
        if FOLD:
            b_m = (b_s.to(tl.int32) + _FOLD_EXP_ADD) << _BF16_MANT  # layout.fold_multiplier_bits: 2^(s - 1)
        else:
            b_m = b_s.to(tl.int32) << _BF16_MANT  # 2^(s - 127); 2^126 applied first
        b_m = b_m.to(tl.int16).to(tl.bfloat16, bitcast=True)
        b_m = tl.broadcast_to(tl.reshape(b_m, [U_N, U_K, 8, 1, 2, 1, 2, 1]), [U_N, U_K, 8, 4, 2, 2, 2, 2])
        b_m = tl.reshape(b_m, [U_N, U_K, 32, 16])  # the multiplier of each byte's pair
        r0, r1 = _decode_pairs(b_w, b_m, FOLD)
        b_v = tl.reshape(tl.join(r0, r1), [U_N, U_K, 8, 4, 4, 2, 2, 2])  # g, q, s, ih, h, w
    # row = rb*16 + ih*8 + g; column = kb*64 + s*16 + w*8 + q*2 + h
    b_v = tl.permute(b_v, (0, 5, 2, 1, 4, 7, 3, 6))
    return tl.reshape(b_v, [U_N * 16, U_K * 64]).to(dt)


@triton.jit
def _tile(tile, p_ids, p_rows, p_tile_expert, p_tile_rows, BM: tl.constexpr, SLOTWISE: tl.constexpr):
    """A tile's (expert, how many of its BM rows hold slots, those slots [BM]). SLOTWISE: tile t is
    slot t alone (its expert read from the router's ids; another rank's slot, -1, holds no row)."""
    o_m = tl.arange(0, BM)
    if SLOTWISE:
        e = tl.load(p_ids + tile)
        n = (e >= 0).to(tl.int32)
        return tl.maximum(e, 0).to(tl.int64), n, tile + o_m * 0
    n = tl.load(p_tile_rows + tile)
    slot = tl.load(p_rows + tile * BM + o_m, mask=o_m < n, other=0)
    return tl.load(p_tile_expert + tile).to(tl.int64), n, slot


@triton.jit
def _item(w, p_ids, p_rows, p_tile_expert, p_tile_rows, n_blk, BM: tl.constexpr, BN: tl.constexpr,
          SPLIT: tl.constexpr, SLOTWISE: tl.constexpr):
    """Work item w: (its K split, first weight row, expert, which of the tile's BM rows hold slots, their slots)."""
    e, n, slot = _tile(w // SPLIT // n_blk, p_ids, p_rows, p_tile_expert, p_tile_rows, BM, SLOTWISE)
    return w % SPLIT, (w // SPLIT % n_blk) * BN, e, tl.arange(0, BM) < n, slot


@triton.jit
def _n_work(p_meta, n_slots, n_blk, SPLIT: tl.constexpr, SLOTWISE: tl.constexpr):
    """Work items of a launch: tiles (the routing's count on the device, or one a slot) x N blocks x splits."""
    if SLOTWISE:
        return n_slots * n_blk * SPLIT
    return tl.load(p_meta) * n_blk * SPLIT


@triton.jit
def _counts(N_BLK: tl.constexpr, STEPS: tl.constexpr, width, K64, BN: tl.constexpr, BK: tl.constexpr,
            SPLIT: tl.constexpr):
    """(N blocks of `width` output rows, K steps of one split): the constants N_BLK and STEPS when given
    (> 0; they stay compile-time constants in the caller), else computed at run time."""
    if N_BLK > 0:
        n_blk: tl.constexpr = N_BLK
        steps: tl.constexpr = STEPS
    else:
        n_blk = tl.cdiv(width, BN)
        steps = tl.cdiv(K64 * 64, BK * SPLIT)
    return n_blk, steps


@triton.jit
def _up_step(p_x, p_w, p_s, sp, n0, e, m_m, slot, i, b_gu, stride_xm, steps, I, K, N16,
             K64, TOPK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             FOLD: tl.constexpr, EMULATE: tl.constexpr, EVEN: tl.constexpr):
    """K step i of a work item: b_gu [2 BN, BM] += this step's BN gate rows, then the same BN up
    rows, times the tile's tokens (one A tile, one MMA chain)."""
    dt = p_x.dtype.element_ty
    kb0 = (sp * steps + i) * (BK // 64)
    o_kx = kb0 * 64 + tl.arange(0, BK)
    b_x = tl.load(p_x + (slot // TOPK).to(tl.int64)[:, None] * stride_xm + o_kx[None, :],
                  mask=m_m[:, None] & (o_kx < K)[None, :], other=0.0)  # [BM, BK] the tile's tokens
    o_r = tl.arange(0, 2 * BN // 16)
    half = o_r % (BN // 16)
    rows = e * N16 + tl.where(o_r < BN // 16, n0 // 16, (I + n0) // 16) + half
    w_gu = _unit_tile(p_w, p_s, rows, half < (I - n0) // 16, kb0, K64, 2 * BN // 16, BK // 64,
                      FOLD, EMULATE, not EVEN, dt)  # [2 BN, BK]
    return tl.dot(w_gu, tl.trans(b_x), b_gu)


@triton.jit
def _up_done(w, b_gu, m_m, p_act, p_part, p_count, stride_act, stride_part_s, stride_part_n, limit,
             n_blk, I, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    """Work item w's epilogue: act = silu(min(g, limit)) * clamp(u, -limit, limit), or, with K split,
    this split's partials and a ticket; the last split to arrive sums them and writes act."""
    b_g, b_u = tl.split(tl.permute(tl.reshape(b_gu, [2, BN, BM]), (1, 2, 0)))  # [BN, BM] each
    sp = w % SPLIT
    tile = w // SPLIT // n_blk
    n0 = (w // SPLIT % n_blk) * BN
    o_m = tl.arange(0, BM)
    o_n = tl.arange(0, BN)
    m_o = ((n0 + o_n) < I)[:, None] & m_m[None, :]
    o_row = (tile * BM + o_m)[None, :]
    last = True
    if SPLIT > 1:
        p_o = p_part + (n0 + o_n)[:, None].to(tl.int64) * stride_part_n + o_row
        tl.store(p_o + sp * stride_part_s, b_g, mask=m_o)
        tl.store(p_o + sp * stride_part_s + I * stride_part_n, b_u, mask=m_o)
        tl.debug_barrier()  # every thread's partials issued before the ticket (released at GPU scope)
        last = tl.atomic_add(p_count + w // SPLIT, 1, sem="acq_rel", scope="gpu") == SPLIT - 1
        if last:
            b_g = tl.zeros([BN, BM], tl.float32)
            b_u = tl.zeros([BN, BM], tl.float32)
            for s in tl.static_range(SPLIT):  # L2 reads: other SMs wrote them
                b_g += tl.load(p_o + s * stride_part_s, mask=m_o, other=0.0, cache_modifier=".cg")
                b_u += tl.load(p_o + s * stride_part_s + I * stride_part_n, mask=m_o, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(p_count + w // SPLIT, 0, sem="relaxed", scope="gpu")
    if last:
        b_g = tl.minimum(b_g, limit)
        b_u = tl.minimum(tl.maximum(b_u, -limit), limit)
        b_a = b_g * tl.sigmoid(b_g) * b_u
        tl.store(p_act + (n0 + o_n)[:, None].to(tl.int64) * stride_act + o_row, b_a.to(p_act.dtype.element_ty),
                 mask=m_o)


@triton.jit
def _moe_up_kernel(p_x, p_w, p_s, p_ids, p_rows, p_tile_expert, p_tile_rows, p_meta, p_act, p_part, p_count,
                   stride_xm, stride_act, stride_part_s, stride_part_n, limit, num_progs, n_slots,
                   I, K, N16, K64, TOPK: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, FLAT: tl.constexpr,
                   FOLD: tl.constexpr, EMULATE: tl.constexpr, EVEN: tl.constexpr, N_BLK: tl.constexpr,
                   STEPS: tl.constexpr, SLOTWISE: tl.constexpr):
    """Persistent: work item (tile, BN gate rows + the same up rows, K split) -> act[n, row] =
    silu(min(g, limit)) * clamp(u, -limit, limit) in x's dtype. With K split, each split stores fp32
    partials part[split, {g, u}, n, row] and takes a ticket (count[item]); the last to arrive sums
    them, writes act and sets the count back to 0 for the next call (so no launch clears it).
    FLAT: one loop over (item, K step), so the pipeline runs on across items (short K loops).
    N_BLK = cdiv(I, BN) and STEPS = cdiv(K, BK * SPLIT) (the K steps of one split) as constants, or 0:
    computed at run time. Constants make the flat loop's divisions by them shifts or multiplies
    instead of a runtime division every K step (a config's `static`). SLOTWISE: n_slots tiles of one
    slot each, experts from p_ids (no routing launch)."""
    pid = tl.program_id(0)
    n_blk, steps = _counts(N_BLK, STEPS, I, K64, BN, BK, SPLIT)
    n_work = _n_work(p_meta, n_slots, n_blk, SPLIT, SLOTWISE)
    b_gu = tl.zeros([2 * BN, BM], tl.float32)  # [2 BN, BM] gate rows, then up rows
    if FLAT:
        for it in range(0, tl.cdiv(tl.maximum(n_work - pid, 0), num_progs) * steps):
            w = pid + it // steps * num_progs
            i = it % steps
            b_gu = tl.where(i == 0, 0.0, b_gu)
            sp, n0, e, m_m, slot = _item(w, p_ids, p_rows, p_tile_expert, p_tile_rows, n_blk, BM, BN, SPLIT, SLOTWISE)
            b_gu = _up_step(p_x, p_w, p_s, sp, n0, e, m_m, slot, i, b_gu, stride_xm, steps, I, K, N16, K64,
                            TOPK, BM, BN, BK, FOLD, EMULATE, EVEN)
            if i == steps - 1:
                _up_done(w, b_gu, m_m, p_act, p_part, p_count, stride_act, stride_part_s, stride_part_n,
                         limit, n_blk, I, BM, BN, SPLIT)
    else:
        for w in range(pid, n_work, num_progs):
            b_gu = tl.zeros([2 * BN, BM], tl.float32)
            sp, n0, e, m_m, slot = _item(w, p_ids, p_rows, p_tile_expert, p_tile_rows, n_blk, BM, BN, SPLIT, SLOTWISE)
            for i in range(steps):
                b_gu = _up_step(p_x, p_w, p_s, sp, n0, e, m_m, slot, i, b_gu, stride_xm, steps, I, K, N16,
                                K64, TOPK, BM, BN, BK, FOLD, EMULATE, EVEN)
            _up_done(w, b_gu, m_m, p_act, p_part, p_count, stride_act, stride_part_s, stride_part_n,
                     limit, n_blk, I, BM, BN, SPLIT)


@triton.jit
def _down_step(p_act, p_w, p_s, sp, n0, e, m_m, tile, i, b_o, stride_act, steps, N, K, N16, K64,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               FOLD: tl.constexpr, EMULATE: tl.constexpr, EVEN: tl.constexpr):
    """K step i of a work item: b_o [BN, BM] += this step's w2 rows times the tile's act columns."""
    o_m = tl.arange(0, BM)
    kb0 = (sp * steps + i) * (BK // 64)
    o_ka = (kb0 * 64 + tl.arange(0, BK))[:, None]  # [BK, 1]
    # every column of the tile is read: a column past the tile's slots holds whatever was there, and
    # stays in its own output column (never stored); a mask along the contiguous columns would make
    # 2-byte loads, which Triton does not pipeline
    b_a = tl.load(p_act + o_ka.to(tl.int64) * stride_act + (tile * BM + o_m)[None, :],
                  mask=(o_ka < K) & (o_m >= 0)[None, :], other=0.0)  # [BK, BM]
    o_r = tl.arange(0, BN // 16)
    w_d = _unit_tile(p_w, p_s, e * N16 + n0 // 16 + o_r, o_r < (N - n0 + 15) // 16, kb0, K64, BN // 16, BK // 64,
                     FOLD, EMULATE, not EVEN, p_act.dtype.element_ty)  # [BN, BK]
    return tl.dot(w_d, b_a, b_o)


@triton.jit
def _down_done(w, b_o, m_m, slot, p_down, stride_ds, stride_dm, n_blk, N,
               BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    """Work item w's rows: down[split, slot, n] = b_o[n, row] for the tile's slots."""
    sp = w % SPLIT
    n0 = (w // SPLIT % n_blk) * BN
    o_n = tl.arange(0, BN)
    p_o = p_down + sp * stride_ds + slot.to(tl.int64)[None, :] * stride_dm + (n0 + o_n)[:, None]
    tl.store(p_o, b_o, mask=((n0 + o_n) < N)[:, None] & m_m[None, :])


@triton.jit
def _down_combine(w, b_o, p_down, p_ids, p_gates, p_out, p_count, stride_ds, stride_dm, stride_om, scale,
                  n_blk, N, TOPK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    """SLOTWISE work item w (slot, BN output rows, K split): its row of down as `_down_done` stores it,
    then a ticket per (token, N block); the last of the token's TOPK x SPLIT items to arrive sums them
    with their gates (`_token_sum`, as the combine kernel sums), writes out[token] and sets the count
    back to 0."""
    sp = w % SPLIT
    slot = (w // SPLIT // n_blk).to(tl.int64)
    nb = w // SPLIT % n_blk
    o_n = nb * BN + tl.arange(0, BN)
    m_n = o_n < N
    b_row = tl.sum(tl.where(tl.arange(0, BM)[None, :] == 0, b_o, 0.0), 1)  # [BN] the slot's column
    tl.store(p_down + sp * stride_ds + slot * stride_dm + o_n, b_row, mask=m_n)
    tl.debug_barrier()  # every thread's row issued before the ticket (released at GPU scope)
    m = slot // TOPK
    if tl.atomic_add(p_count + m * n_blk + nb, 1, sem="acq_rel", scope="gpu") == TOPK * SPLIT - 1:
        b_out = _token_sum(p_down, p_ids, p_gates, m, o_n, m_n, stride_ds, stride_dm, TOPK, SPLIT, ".cg")
        tl.store(p_out + m * stride_om + o_n, (b_out * scale).to(p_out.dtype.element_ty), mask=m_n)
        tl.atomic_xchg(p_count + m * n_blk + nb, 0, sem="relaxed", scope="gpu")


@triton.jit
def _token_sum(p_down, p_ids, p_gates, m, o_n, m_n, stride_ds, stride_dm, TOPK: tl.constexpr, SPLIT: tl.constexpr,
               CACHE: tl.constexpr):
    """sum_j gates[m, j] * sum_s down[s, m * TOPK + j, o_n] over token m's slots on this rank (fp32).
    Rows of other ranks' slots were never written (or hold garbage): selected away, not multiplied."""
    b_out = tl.zeros(o_n.shape, tl.float32)
    for j in tl.static_range(TOPK):
        at = m * TOPK + j + o_n * 0  # [BN] the same slot: a vector, since the interpreter refuses a scalar mask
        ok = tl.load(p_ids + at) >= 0
        g = tl.load(p_gates + at)
        b_d = tl.zeros(o_n.shape, tl.float32)
        for s in tl.static_range(SPLIT):
            b_d += tl.load(p_down + s * stride_ds + (m * TOPK + j) * stride_dm + o_n, mask=m_n & ok, other=0.0,
                           cache_modifier=CACHE)
        b_out += tl.where(ok, g, 0.0) * b_d
    return b_out


@triton.jit
def _down_epilogue(w, b_o, m_m, slot, p_down, p_ids, p_gates, p_out, p_count, stride_ds, stride_dm, stride_om, scale,
                   n_blk, N, TOPK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr,
                   SLOTWISE: tl.constexpr):
    """Work item w's end: its rows of down (`_down_done`), slotwise also the token's combine (`_down_combine`)."""
    if SLOTWISE:
        _down_combine(w, b_o, p_down, p_ids, p_gates, p_out, p_count, stride_ds, stride_dm, stride_om, scale, n_blk, N,
                      TOPK, BM, BN, SPLIT)
    else:
        _down_done(w, b_o, m_m, slot, p_down, stride_ds, stride_dm, n_blk, N, BM, BN, SPLIT)


@triton.jit
def _moe_down_kernel(p_act, p_w, p_s, p_ids, p_rows, p_tile_expert, p_tile_rows, p_meta, p_down,
                     p_gates, p_out, p_count, stride_act, stride_ds, stride_dm, stride_om, scale, num_progs, n_slots,
                     N, K, N16, K64, TOPK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     SPLIT: tl.constexpr, FLAT: tl.constexpr, FOLD: tl.constexpr, EMULATE: tl.constexpr,
                     EVEN: tl.constexpr, N_BLK: tl.constexpr, STEPS: tl.constexpr, SLOTWISE: tl.constexpr):
    """Persistent: work item (tile, BN output rows, K split): down[split, slot] = act W2^T (fp32).
    FLAT, N_BLK, STEPS and SLOTWISE as in the gate/up kernel; SLOTWISE also sums each token's rows
    into out (`_down_combine`: no combine launch)."""
    pid = tl.program_id(0)
    n_blk, steps = _counts(N_BLK, STEPS, N, K64, BN, BK, SPLIT)
    n_work = _n_work(p_meta, n_slots, n_blk, SPLIT, SLOTWISE)
    b_o = tl.zeros([BN, BM], tl.float32)  # [BN, BM]
    if FLAT:
        for it in range(0, tl.cdiv(tl.maximum(n_work - pid, 0), num_progs) * steps):
            w = pid + it // steps * num_progs
            i = it % steps
            b_o = tl.where(i == 0, 0.0, b_o)
            sp, n0, e, m_m, slot = _item(w, p_ids, p_rows, p_tile_expert, p_tile_rows, n_blk, BM, BN, SPLIT, SLOTWISE)
            b_o = _down_step(p_act, p_w, p_s, sp, n0, e, m_m, w // SPLIT // n_blk, i, b_o, stride_act, steps, N, K,
                             N16, K64, BM, BN, BK, FOLD, EMULATE, EVEN)
            if i == steps - 1:
                _down_epilogue(w, b_o, m_m, slot, p_down, p_ids, p_gates, p_out, p_count, stride_ds, stride_dm,
                               stride_om, scale, n_blk, N, TOPK, BM, BN, SPLIT, SLOTWISE)
    else:
        for w in range(pid, n_work, num_progs):
            b_o = tl.zeros([BN, BM], tl.float32)
            sp, n0, e, m_m, slot = _item(w, p_ids, p_rows, p_tile_expert, p_tile_rows, n_blk, BM, BN, SPLIT, SLOTWISE)
            for i in range(steps):
                b_o = _down_step(p_act, p_w, p_s, sp, n0, e, m_m, w // SPLIT // n_blk, i, b_o, stride_act, steps, N,
                                 K, N16, K64, BM, BN, BK, FOLD, EMULATE, EVEN)
            _down_epilogue(w, b_o, m_m, slot, p_down, p_ids, p_gates, p_out, p_count, stride_ds, stride_dm,
                           stride_om, scale, n_blk, N, TOPK, BM, BN, SPLIT, SLOTWISE)


@triton.jit
def _moe_combine_kernel(p_down, p_ids, p_gates, p_out, stride_ds, stride_dm, stride_om, scale,
                        N: tl.constexpr, TOPK: tl.constexpr, SPLIT: tl.constexpr, BN: tl.constexpr):
    """out[m] = scale * sum_j gates[m, j] * sum_s down[s, m * TOPK + j] over the slots on this rank."""
    i_m = tl.program_id(0).to(tl.int64)
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    m_n = o_n < N
    b_o = _token_sum(p_down, p_ids, p_gates, i_m, o_n, m_n, stride_ds, stride_dm, TOPK, SPLIT, "")
    tl.store(p_out + i_m * stride_om + o_n, (b_o * scale).to(p_out.dtype.element_ty), mask=m_n)


@dataclass(frozen=True)
class Routing:
    """The slots on this rank grouped by expert in tiles of bm rows, on the device: rows [P] (the slot
    at each row; rows past a tile's count are never written), tile_expert and tile_rows [T] (a tile's
    expert and slot count), meta [1] = the number of tiles used (T is the most any routing needs)."""

    rows: torch.Tensor
    tile_expert: torch.Tensor
    tile_rows: torch.Tensor
    meta: torch.Tensor
    block_m: int

    @property
    def max_tiles(self) -> int:
        return self.tile_expert.numel()


@triton.jit
def _route_kernel(p_ids, p_counts, p_start, p_rank, p_rows, p_tile_expert, p_tile_rows, p_meta, S, R,
                  BM: tl.constexpr, R_P: tl.constexpr, CH: tl.constexpr, ONE_PASS: tl.constexpr):
    """One program: each slot's place in its expert's run by an atomic count (the order within an
    expert is whatever the atomics give: every row is computed alone, so no result depends on it),
    the experts' tile starts by a prefix sum, then every slot to its row and every tile's expert.
    ONE_PASS (few slots, CH >= S): the same in registers, one read and one write of memory, the
    place by counting earlier slots of the same expert (slot order) instead of atomics."""
    o_e = tl.arange(0, R_P)
    m_e = o_e < R
    if ONE_PASS:
        o_s = tl.arange(0, CH)
        ids = tl.load(p_ids + o_s, mask=o_s < S, other=-1)
        ok = (ids >= 0) & (ids < R)
        hot = (ids[:, None] == o_e[None, :]) & ok[:, None]  # [CH, R_P]
        counts = tl.sum(hot.to(tl.int32), 0)
        tiles = (counts + BM - 1) // BM
        start = tl.cumsum(tiles, 0) - tiles
        rank = tl.sum(((ids[:, None] == ids[None, :]) & (o_s[None, :] < o_s[:, None])).to(tl.int32), 1)  # [CH]
        first = tl.sum(tl.where(hot, start[None, :], 0), 1)
        count = tl.sum(tl.where(hot, counts[None, :], 0), 1)
        tl.store(p_rows + first * BM + rank, o_s, mask=ok)
        lead = ok & (rank % BM == 0)
        tl.store(p_tile_expert + first + rank // BM, ids, mask=lead)
        tl.store(p_tile_rows + first + rank // BM, tl.minimum(count - rank, BM), mask=lead)
        tl.store(p_meta + o_e, tl.sum(tiles, 0) + o_e * 0, mask=o_e == 0)
        return
    tl.store(p_counts + o_e, tl.zeros([R_P], tl.int32), mask=m_e)
    tl.debug_barrier()
    for c0 in range(0, S, CH):
        o_s = c0 + tl.arange(0, CH)
        ids = tl.load(p_ids + o_s, mask=o_s < S, other=-1)
        ok = (ids >= 0) & (ids < R)
        rank = tl.atomic_add(p_counts + ids, tl.full([CH], 1, tl.int32), mask=ok)
        tl.store(p_rank + o_s, rank, mask=ok)
    tl.debug_barrier()
    counts = tl.load(p_counts + o_e, mask=m_e, other=0)
    tiles = (counts + BM - 1) // BM
    start = tl.cumsum(tiles, 0) - tiles  # each expert's first tile
    tl.store(p_start + o_e, start, mask=m_e)
    tl.store(p_meta + o_e, tl.sum(tiles, 0) + o_e * 0, mask=o_e == 0)
    tl.debug_barrier()
    for c0 in range(0, S, CH):
        o_s = c0 + tl.arange(0, CH)
        ids = tl.load(p_ids + o_s, mask=o_s < S, other=-1)
        ok = (ids >= 0) & (ids < R)
        rank = tl.load(p_rank + o_s, mask=ok, other=0)
        first = tl.load(p_start + ids, mask=ok, other=0)
        count = tl.load(p_counts + ids, mask=ok, other=0)
        tl.store(p_rows + first * BM + rank, o_s, mask=ok)
        t = first + rank // BM
        lead = ok & (rank % BM == 0)
        tl.store(p_tile_expert + t, ids, mask=lead)
        tl.store(p_tile_rows + t, tl.minimum(count - rank, BM), mask=lead)


# The routing in registers when the [slots, experts] and [slots, slots] comparisons stay small (tp4 and
# dp-ep to C = 2): one memory round trip instead of the atomics' four. Measured on the H200 (bench at
# 6c78298): 2.0-2.7 us at 2,048 elements, but 11.7 us at 32,768 (tp4 C = 16) where the atomics take
# 3.2 us for twice the slots (tp4 C = 32), so the registers win only while the comparisons are tiny.
ONE_PASS_SLOTS = 128
ONE_PASS_ELEMENTS = 1 << 12


def max_tiles(slots: int, experts: int, block_m: int) -> int:
    """The most tiles any routing of `slots` slots over `experts` experts takes: every used tile holds
    a slot, and an expert's run wastes under one tile."""
    return max(1, min(slots, (slots + min(experts, slots) * (block_m - 1)) // block_m))


def route(local_ids: torch.Tensor, experts: int, block_m: int) -> Routing:
    """Group the slots of `local_ids` [M, k] by expert, dropping -1 (other ranks'): one launch,
    fixed shapes, no host synchronisation. Where Triton cannot run, `route_torch`."""
    flat = local_ids.reshape(-1)
    if not runs_triton(flat):
        return route_torch(local_ids, experts, block_m)
    S = flat.numel()
    T = max_tiles(S, experts, block_m)
    dev = flat.device
    i32 = dict(dtype=torch.int32, device=dev)
    rows, tile_expert, tile_rows = torch.empty(T * block_m, **i32), torch.empty(T, **i32), torch.empty(T, **i32)
    meta, counts, start, rank = torch.empty(1, **i32), torch.empty(experts, **i32), torch.empty(experts, **i32), torch.empty(max(S, 1), **i32)
    r_p, s_p = triton.next_power_of_2(experts), triton.next_power_of_2(max(S, 1))
    one_pass = s_p <= ONE_PASS_SLOTS and s_p * r_p <= ONE_PASS_ELEMENTS
    _route_kernel[(1,)](p_ids=flat.to(torch.int32).contiguous(), p_counts=counts, p_start=start, p_rank=rank,
                        p_rows=rows, p_tile_expert=tile_expert, p_tile_rows=tile_rows, p_meta=meta, S=S, R=experts,
                        BM=block_m, R_P=r_p, CH=max(s_p, 16) if one_pass else 1024, ONE_PASS=one_pass, num_warps=8)
    return Routing(rows, tile_expert, tile_rows, meta, block_m)


def route_torch(local_ids: torch.Tensor, experts: int, block_m: int) -> Routing:
    """`route` in torch operations (slot order within an expert): the CPU path and the reference the
    kernel's tile metadata is held to. Rows past a tile's count are -1 here."""
    flat = local_ids.reshape(-1).long()
    S = flat.numel()
    dev = flat.device
    ok = (flat >= 0) & (flat < experts)
    key = torch.where(ok, flat, experts)
    counts = torch.zeros(experts + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))[:experts]
    tiles = (counts + block_m - 1) // block_m
    start = torch.cumsum(tiles, 0) - tiles
    T = max_tiles(S, experts, block_m)
    order = torch.argsort(key, stable=True)
    first = torch.cumsum(counts, 0) - counts
    ks = key[order]
    valid = ks < experts
    rank = torch.arange(S, device=dev) - torch.cat([first, first.new_zeros(1)])[ks]
    dest = torch.where(valid, torch.cat([start, start.new_zeros(1)])[ks] * block_m + rank, T * block_m)
    rows = torch.full((T * block_m + 1,), -1, dtype=torch.int32, device=dev)
    rows.scatter_(0, dest, order.to(torch.int32))
    tile_expert = torch.zeros(T, dtype=torch.int32, device=dev)
    tile_rows = torch.zeros(T, dtype=torch.int32, device=dev)
    used = int(tiles.sum())
    for e in torch.nonzero(tiles).flatten().tolist():
        t0, n = int(start[e]), int(tiles[e])
        tile_expert[t0 : t0 + n] = e
        tile_rows[t0 : t0 + n] = (int(counts[e]) - block_m * torch.arange(n, device=dev)).clamp(max=block_m).int()
    return Routing(rows[:-1], tile_expert, tile_rows, torch.tensor([used], dtype=torch.int32, device=dev), block_m)


_TICKETS: dict[torch.device, list[torch.Tensor]] = {}


def _tickets(device: torch.device, n: int) -> torch.Tensor:
    """The tickets of gate/up's K splits and of slotwise down's tokens: zero between calls (the last
    arrival resets its own), so they are allocated once per device, outside capture where possible:
    a set first grown inside a capture is zeroed by the recorded fill, i.e. at that graph's first
    replay, so call the slot once eagerly at the captured shape first (the workload's warm-up does;
    a capture runs on its own stream, which is why the set is not kept per stream). One call in
    flight a device: two streams running the slot at once would share the tickets. A larger set
    replaces a smaller one for later calls; the old one is kept, since a captured graph may still
    point at it."""
    held = _TICKETS.setdefault(device, [])
    if not held or held[-1].numel() < n:
        held.append(torch.zeros(max(n, 1024), dtype=torch.int32, device=device))
    return held[-1]


# (kernel, device, launch constants) -> programs an SM can hold, from the first launch's registers and
# shared memory: a persistent program that is not resident runs its items after the others finish.
_RESIDENT: dict[tuple, int] = {}


def _resident(compiled, warps: int, sm: DeviceLimits) -> int:
    """Programs of `compiled` one SM of `sm` holds at once: registers, shared memory and threads."""
    regs = -(-compiled.n_regs // 8) * 8 * 32 * warps  # registers go to warps in blocks of 256
    shared = compiled.metadata.shared + 1024  # the driver keeps 1 KB a block
    return max(1, min(sm.regs_per_sm // regs, sm.shared_per_sm // shared, sm.threads_per_sm // (32 * warps)))


def _persistent(kernel, device: torch.device, tiles, work_max: int, **args) -> None:
    """Launch `kernel` on a persistent grid: tiles.ctas programs an SM (no more than fit), never more
    than there can be work items."""
    key = (id(kernel), str(device), tiles, tuple(sorted((k, v) for k, v in args.items() if k.isupper())))
    ctas = min(tiles.ctas, _RESIDENT.get(key, tiles.ctas))
    sms = sm_count(device) if device.type == "cuda" or compile_only() else 4
    progs = max(1, min(ctas * sms, work_max))
    extra = {"maxnreg": tiles.maxnreg} if tiles.maxnreg else {}
    compiled = kernel[(progs,)](num_progs=progs, num_warps=tiles.warps, num_stages=tiles.stages, **extra, **args)
    if key not in _RESIDENT and getattr(compiled, "n_regs", None) is not None and device.type == "cuda":
        _RESIDENT[key] = _resident(compiled, tiles.warps, device_limits(device))


def _routing_args(ids: torch.Tensor, r: Routing | None) -> tuple[int, dict]:
    """(tiles, the GEMM kernels' routing arguments): the routing's tensors, or with no routing (slotwise)
    one tile a slot, read from the ids alone (the routing pointers are then never read: ids stand in)."""
    if r is None:
        S = ids.numel()
        return S, dict(p_ids=ids, p_rows=ids, p_tile_expert=ids, p_tile_rows=ids, p_meta=ids, n_slots=S, SLOTWISE=True)
    return r.max_tiles, dict(p_ids=ids, p_rows=r.rows, p_tile_expert=r.tile_expert, p_tile_rows=r.tile_rows,
                             p_meta=r.meta, n_slots=0, SLOTWISE=False)


def _shape_constants(tiles, n_blk: int, k_cols: int) -> dict[str, int]:
    """A GEMM's N_BLK and STEPS launch constants: its N blocks and the K steps of one split for a
    static config, else 0 (the kernel computes them at run time)."""
    if not tiles.static:
        return {"N_BLK": 0, "STEPS": 0}
    return {"N_BLK": n_blk, "STEPS": triton.cdiv(k_cols, tiles.bk * tiles.split)}


def direct_tiles(cfg: MoeConfig) -> tuple[DirectTiles, DirectTiles]:
    """The direct kernels' (gate/up, down) tiles of a config: its weight rows a warp in units of 16
    (gate/up's bn act rows are half its weight rows). Both GEMMs direct or neither, whole units a warp."""
    up, dn = cfg.up, cfg.down
    if not (up.direct and dn.direct and (2 * up.bn) % (UNIT_ROWS * up.warps) == 0
            and dn.bn % (UNIT_ROWS * dn.warps) == 0 and up.bn and dn.bn):
        raise ValueError(f"{cfg.name}: the direct kernels take both GEMMs, in whole 16-row units a warp")
    return (DirectTiles(up.warps, 2 * up.bn // (UNIT_ROWS * up.warps), up.split),
            DirectTiles(dn.warps, dn.bn // (UNIT_ROWS * dn.warps), dn.split))


def table_config(x: torch.Tensor, experts: int, width: int, slots: int) -> MoeConfig:
    """The table's config for a call on x [M, d]: its Gluon rows (warp-specialised, direct) only where
    those kernels run on x's device, else the Triton rows they replaced."""
    return choose(experts, width, x.shape[1], slots, ws=ws_runs_on(x))


def grouped_routed_experts(x: torch.Tensor, local_ids: torch.Tensor, gates: torch.Tensor, w13: Mxfp4Experts,
                           w2: Mxfp4Experts, limit: float, scale: float, config: MoeConfig | None = None) -> torch.Tensor:
    """The `routed_experts` slot (dsv4opt/workload/slots.py), grouped by expert on tensor cores.

    x: [M, d]; local_ids: [M, k] int32 in [-1, R) (-1: another rank's expert; slotwise tiles read
    the weights of whatever id they hold, the routing drops ids past R); gates: [M, k] fp32;
    w13: [R, 2I, d], w2: [R, d, I] MXFP4 -> [M, d] in x's dtype. CUDA-graph safe once each weight's
    production-layout copy exists (built on the first eager call). Where Triton cannot run (a CPU
    without the interpreter) the float64-free plain-torch definition, expert by expert.
    """
    if not (runs_triton(x) and dot_dtype_ok(x.dtype)):
        return naive.routed_experts(x, local_ids, gates, w13, w2, limit, scale)
    M, d = x.shape
    k = local_ids.shape[1]
    R, two_i, K13 = w13.packed.shape
    I = two_i // 2
    assert K13 * 2 == d and w2.packed.shape == (R, d, I // 2) and d % MXFP4_GROUP == 0 and I % MXFP4_GROUP == 0
    assert x.stride(1) == 1 and local_ids.is_contiguous() and gates.is_contiguous()
    p13, p2 = packed_experts(w13), packed_experts(w2)
    cfg = config or table_config(x, R, I, M * k)
    ids = local_ids.to(torch.int32)
    out = torch.empty(M, d, device=x.device, dtype=x.dtype)
    if M == 0:
        return out
    if cfg.slotwise and M * k == 0:
        return out.zero_()  # no slot, no item: nothing else writes out
    if cfg.up.direct or cfg.down.direct:
        up_d, down_d = direct_tiles(cfg)
        if direct_supported(x, p13, p2, up_d, down_d):
            tickets = _tickets(x.device, tickets_needed(M * k, M, I, d, up_d, down_d))
            return direct_routed_experts(x, ids, gates, p13, p2, limit, scale, tickets, up_d, down_d)
        cfg = choose(R, I, d, M * k, ws=False)  # the Triton row the direct one replaced
    r = None if cfg.slotwise else route(ids, R, cfg.bm)
    T, routing = _routing_args(ids, r)
    P = T * cfg.bm
    up, dn = cfg.up, cfg.down
    act = torch.empty(I, P, device=x.device, dtype=x.dtype)
    part = torch.empty(up.split if up.split > 1 else 1, 2 * I if up.split > 1 else 1, P, device=x.device,
                       dtype=torch.float32)
    down = torch.empty(dn.split, M * k, d, device=x.device, dtype=torch.float32)
    emulate = interpreted()
    n_blk = triton.cdiv(I, up.bn)
    n_blk_down = triton.cdiv(d, dn.bn)
    # gate/up's tickets [T * n_blk], then (slotwise) down's [M * n_blk_down], 16-byte aligned
    up_tickets = -(-T * n_blk // 4) * 4
    tickets = _tickets(x.device, up_tickets + (M * n_blk_down if cfg.slotwise else 0))
    if up.ws and up.split == 1 and ws_supported(x, p13, cfg.bm, cfg.slotwise):  # its fixed tiles: BN 64, BK 128
        ws_gate_up(x, r, p13, act, limit, k, ctas=up.ctas, stages=up.stages)
    else:
        _persistent(
            _moe_up_kernel, x.device, up, T * n_blk * up.split,
            p_x=x, p_w=p13.values, p_s=p13.scales, p_act=act, p_part=part, p_count=tickets, stride_xm=x.stride(0),
            stride_act=act.stride(0), stride_part_s=part.stride(0), stride_part_n=part.stride(1), limit=limit,
            I=I, K=d, N16=p13.n16, K64=p13.k64, TOPK=k,
            BM=cfg.bm, BN=up.bn, BK=up.bk, SPLIT=up.split, FLAT=up.flat, FOLD=p13.fold, EMULATE=emulate,
            **_shape_constants(up, n_blk, p13.k64 * UNIT_COLS), **routing,
            EVEN=(I % up.bn == 0 and (p13.k64 * UNIT_COLS) % (up.bk * up.split) == 0 and d == p13.k64 * UNIT_COLS),
        )
    if dn.ws and dn.split == 1 and ws_down_supported(act, p2, cfg.bm, cfg.slotwise):  # fixed tiles: BN 128, BK 128
        ws_down(act, r, p2, down[0], ctas=dn.ctas, stages=dn.stages)
    else:
        _persistent(
            _moe_down_kernel, x.device, dn, T * n_blk_down * dn.split,
            p_act=act, p_w=p2.values, p_s=p2.scales, p_down=down, p_gates=gates, p_out=out,
            p_count=tickets[up_tickets:], stride_act=act.stride(0), stride_ds=down.stride(0), stride_dm=down.stride(1),
            stride_om=out.stride(0), scale=scale, N=d, K=I, N16=p2.n16, K64=p2.k64, TOPK=k,
            BM=cfg.bm, BN=dn.bn, BK=dn.bk, SPLIT=dn.split, FLAT=dn.flat, FOLD=p2.fold, EMULATE=emulate,
            **_shape_constants(dn, n_blk_down, p2.k64 * UNIT_COLS), **routing,
            EVEN=(d % dn.bn == 0 and (p2.k64 * UNIT_COLS) % (dn.bk * dn.split) == 0 and I == p2.k64 * UNIT_COLS),
        )
    if not cfg.slotwise:
        bc = min(1024, triton.next_power_of_2(d))
        _moe_combine_kernel[(M, triton.cdiv(d, bc))](
            p_down=down, p_ids=local_ids, p_gates=gates, p_out=out, stride_ds=down.stride(0), stride_dm=down.stride(1),
            stride_om=out.stride(0), scale=scale, N=d, TOPK=k, SPLIT=dn.split, BN=bc, num_warps=4,
        )
    return out


__all__ = ["Routing", "grouped_routed_experts", "max_tiles", "route", "route_torch", "table_config", "PackedExperts",
           "UNIT_BYTES", "UNIT_ROWS", "UNIT_SCALES"]
