"""grouped-moe's two GEMMs warp-specialised (Gluon, sm_90a): the production kernels' stream, fed by a producer warp.

What they stand for: `_moe_up_kernel` and `_moe_down_kernel` (kernel.py) on routed tiles, the
weight stream split the way benchmarks/probe_grouped_moe_ws.py measured it (tp4 67.8-71.9%, dp-ep
68.5-70.7% of the H200's copy bandwidth against ~63% for the plain Triton loop; best: 4 stages,
1 consumer warpgroup, 1 wgmma in flight, 2 programs an SM; the table runs 6 stages). Persistent over work items (a tile of
BM = 16 slots of one expert x 128 weight rows: gate/up's BN = 64 gate rows and the same 64 up rows,
down's 128 output rows; every K step of BK = 128 columns), two partitions:
- producer (1 warp): per K step, after waiting `empty`, cp.async of the step's 16 weight units and
  their e8m0 scales (the production layout, layout.py) and of the tile's tokens (gate/up:
  16 token rows of x, rows past the tile's slots zero-filled; down: 128 rows of act's 16 tile
  columns) into a shared ring, then a noinc arrive on `full` that lands when its copies have;
- consumer (the default warpgroup): waits `full`, decodes each lane's 16 value bytes and scale word
  with the production shifts, masks and folded bf16x2 multiply straight into the wgmma A registers,
  wgmma [128, 16] += A [128, 128] x tokens [128, 16] from the ring, releases a slot once the wgmma
  reading its tokens has retired; then gate/up's `_up_done` (clamped SwiGLU, SPLIT = 1) into act[I, P],
  or, as down's `_down_done` does with SPLIT = 1, fp32 rows into down[slot, d] for the combine kernel
  (`_down_rows`).

Not covered (the Triton kernels keep them): K splits, slotwise tiles, unfolded scales (scales above
2), other tile shapes, ragged K or N, fp16 tokens. `ws_supported` / `ws_down_supported` say when
each applies. Checked on the H200 by the graph-replay test (float64, NaN-poisoned) and the sweep.

    PYTHONPATH=. python3 -m dsv4opt.workload.kernels.grouped_moe.ws --compile-only [--down] [--stages 4] [--ctas 2]
"""

from __future__ import annotations

import argparse
import re

import torch
import triton

from dsv4opt.sass import listing, ptxas_log, tightest_loop
from dsv4opt.tritonlib import HOPPER_SHARED_PER_BLOCK, device_limits, interpreted, sm_count
from dsv4opt.workload.kernels.grouped_moe.layout import BF16_MANTISSA_BITS, FOLD_EXP_ADD

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)
    GLUON = True
except Exception:  # noqa: BLE001  (no Gluon, or one without Hopper's API: the kernels stay uncompiled)
    GLUON = False

    class _Absent:
        """Stands in for `gluon` and `gl` so the kernels below are defined (never compiled)."""
        jit = staticmethod(lambda fn: fn)
        constexpr = staticmethod(lambda v: v)

    gluon = gl = _Absent

# The Gluon API the kernels are written against (the H200's Triton): 3.9 replaced async_copy_global_to_shared
# by async_load, so elsewhere `ws_runs_on` says no rather than fail at compile time.
GLUON_API_OK = GLUON and triton.__version__.split(".")[:2] == ["3", "6"]

BM, BN, BK = 16, 64, 128  # slots a tile, gate (and up) rows an item, columns a K step
DOWN_BN = 2 * BN  # down's output rows an item: the same 128-row A tile
PRODUCER_REGS = 56  # setmaxnreg of the producer partition (48 spills 8 bytes); its warp pads to a warpgroup
_BM, _BN, _BK = gl.constexpr(BM), gl.constexpr(BN), gl.constexpr(BK)
_UNITS = gl.constexpr(2 * BN // 16 * (BK // 64))  # 16 units a step, index kb * 8 + stacked row unit


def decode_asm() -> str:
    """PTX for one lane's 16 value bytes ($16-$19) and scale word ($20: bytes (group, row half)) ->
    32 bf16 in $0-$15, as benchmarks/probe_grouped_moe_ws.py and `_decode_pairs` (FOLD) decode:
    $2s, $2s+1 = pairs 0, 1 of word s; $8+2s, $9+2s = pairs 2, 3; multiplier 2^(e - 1) = layout.fold_multiplier_bits(e), four bytes at once."""
    mask = "0x81C081C0"
    lines = ["{", ".reg .b32 t, u, v, e, m0, m1, m2, m3;", f"add.u32 e, $20, 0x{FOLD_EXP_ADD * 0x01010101:08X};"]
    for j in range(4):  # e8m0 byte j (scales <= 2: no carry between bytes) into both halves
        lines += [f"prmt.b32 m{j}, e, 0, 0x{4 * 0x1010 + j * 0x101:04X};", f"shl.b32 m{j}, m{j}, {BF16_MANTISSA_BITS};"]
    for s in range(4):
        q, p0, p1, p2, p3 = f"${16 + s}", f"${2 * s}", f"${2 * s + 1}", f"${8 + 2 * s}", f"${9 + 2 * s}"
        lo, hi = f"m{2 * (s // 2)}", f"m{2 * (s // 2) + 1}"  # (group s // 2, row half 0 / 1)
        lines += [f"and.b32 {p0}, {q}, {mask};", f"shl.b32 t, {q}, 3;", f"and.b32 {p1}, t, {mask};",
                  f"shl.b32 t, {q}, 6;", f"and.b32 {p2}, t, {mask};",
                  f"shl.b32 t, {q}, 1;", "and.b32 t, t, 0x80008000;", f"shr.b32 u, {q}, 3;",
                  "and.b32 u, u, 0x01800180;", f"shr.b32 v, {q}, 7;", "and.b32 v, v, 0x00400040;",
                  "or.b32 t, t, u;", f"or.b32 {p3}, t, v;",
                  f"mul.rn.bf16x2 {p0}, {p0}, {lo};", f"mul.rn.bf16x2 {p2}, {p2}, {lo};",
                  f"mul.rn.bf16x2 {p1}, {p1}, {hi};", f"mul.rn.bf16x2 {p3}, {p3}, {hi};"]
    return "\n".join(lines + ["}"])


_DECODE_ASM = gl.constexpr(decode_asm())


# the [128, 16] accumulator of one warpgroup's wgmma (two m64 halves: a thread holds rows r and r + 64,
# gate/up's gate and up row, or two of down's output rows)
_ACC_L = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
                      if GLUON else None)


@gluon.jit
def _decode(b_v, b_s):
    """b_v [16 units, 8 g, 4 q, 4 s, 4 b] u8 (a lane's 16 bytes), b_s [16, 8, 1, 1, 4] (its scale
    word) -> the step's [128, 128] bf16 A tile in the wgmma register layout (a free conversion)."""
    r0, r1 = gl.inline_asm_elementwise(_DECODE_ASM, "=r," * 16 + "r,r,r,r,r,r,r,r", [b_v, b_s],
                                       dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=16)
    b_t = gl.reshape(gl.join(r0, r1), [2, 8, 8, 4, 4, 2, 2, 2])  # kb, row unit, g, q, s, ih, h, w
    # row = unit * 16 + ih * 8 + g; column = kb * 64 + s * 16 + w * 8 + q * 2 + h
    b_t = gl.reshape(gl.permute(b_t, (1, 5, 2, 0, 4, 7, 3, 6)), [2 * _BN, _BK])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=_ACC_L, k_width=2)
    return gl.convert_layout(b_t, a_l, assert_trivial=True)


@gluon.jit
def _step(vals, scs, toks, full, empty, acc, t, release_prev, STAGES: gl.constexpr, DOWN: gl.constexpr):
    """K step t: wait `full`, decode the slot's units, issue the wgmma on the slot's tokens, retire
    step t - 1's wgmma and only then release its slot (its wgmma read the tokens there). The tokens
    sit K-major for gate/up ([16, 128] rows of x), slot-major for down ([128, 16] rows of act)."""
    lv: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4, 4], [1, 8, 4, 1, 1], [4, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    slot = t % STAGES
    mbarrier.wait(full.index(slot), (t // STAGES) & 1)
    fence_async_shared()  # cp.async wrote the tokens through the generic proxy; wgmma reads them async
    b_v = vals.index(slot).reshape([_UNITS, 8, 4, 4, 4]).load(lv)  # warp w: row units w and w + 4
    b_s = scs.index(slot).reshape([_UNITS, 8, 4]).load(gl.SliceLayout(2, gl.SliceLayout(3, lv)))
    b_a = _decode(b_v, gl.expand_dims(gl.expand_dims(b_s, 2), 3))
    if DOWN:
        b_b = toks.index(slot)
    else:
        b_b = toks.index(slot).permute((1, 0))
    acc = warpgroup_mma(b_a, b_b, acc, is_async=True)
    acc = warpgroup_mma_wait(1, deps=[acc])
    mbarrier.arrive(empty.index((t + STAGES - 1) % STAGES), pred=release_prev)
    return acc


@gluon.jit
def _epilogue(acc, p_act, stride_act, tile, n0, n_rows, limit):
    """`_up_done` with SPLIT = 1: act[n0 + n, tile * BM + m] = silu(min(g, limit)) * clamp(u, -limit,
    limit) for the tile's slots (m < n_rows); rows 0-63 of acc are gate, 64-127 up."""
    b_g, b_u = gl.split(gl.permute(gl.reshape(acc, [2, _BN, _BM]), (1, 2, 0)))
    out_l: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 1], [1, 0])  # 8 slots of a row a thread (2-byte stores: the mask runs along them)
    b_g = gl.minimum(gl.convert_layout(b_g, out_l), limit)
    b_u = gl.convert_layout(b_u, out_l)
    b_u = gl.minimum(gl.maximum(b_u, -limit), limit)
    b_a = b_g * (1 / (1 + gl.exp(-b_g))) * b_u  # tl.sigmoid's definition
    o_n = gl.arange(0, _BN, layout=gl.SliceLayout(1, out_l))
    o_m = gl.arange(0, _BM, layout=gl.SliceLayout(0, out_l))
    p_o = p_act + (n0 + o_n).to(gl.int64)[:, None] * stride_act + (tile * _BM + o_m)[None, :]
    gl.store(p_o, b_a.to(p_act.dtype.element_ty), mask=(o_m < n_rows)[None, :] & (o_n >= 0)[:, None])


@gluon.jit
def _down_rows(acc, p_down, stride_dm, p_rows, tile, n0, n_rows):
    """`_down_done` with SPLIT = 1: down[slot, n0 + n] = acc[n, m] for the tile's slots (m < n_rows),
    slot = rows[tile * BM + m]; a warp stores whole 512-byte rows."""
    out_l: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1])
    b_o = gl.convert_layout(acc, out_l)
    o_n = gl.arange(0, 2 * _BN, layout=gl.SliceLayout(1, out_l))
    o_m = gl.arange(0, _BM, layout=gl.SliceLayout(0, out_l))
    m_m = o_m < n_rows
    slot = gl.load(p_rows + tile * _BM + o_m, mask=m_m, other=0)
    p_o = p_down + slot.to(gl.int64)[None, :] * stride_dm + (n0 + o_n)[:, None]
    gl.store(p_o, b_o, mask=m_m[None, :] & (o_n >= 0)[:, None])


@gluon.jit
def _consumer(vals, scs, toks, full, empty, p_rows, p_tile_rows, p_meta, p_out, stride_out, limit, num_progs, n_blk,
              K64, STAGES: gl.constexpr, DOWN: gl.constexpr):
    """Every item's K steps, two an iteration: a wgmma reads its register A asynchronously, so with
    one left in flight the next decode needs registers of its own (one step a loop iteration would
    overwrite the in-flight A: the probe's check failed so)."""
    n_items = gl.load(p_meta) * n_blk
    steps = K64 // 2
    t = 0
    for w in range(gl.program_id(0), n_items, num_progs):
        acc = gl.zeros([2 * _BN, _BM], gl.float32, _ACC_L)
        for j in range(steps // 2):
            acc = _step(vals, scs, toks, full, empty, acc, t, j > 0, STAGES, DOWN)
            acc = _step(vals, scs, toks, full, empty, acc, t + 1, True, STAGES, DOWN)
            t += 2
        if steps % 2 == 1:
            acc = warpgroup_mma_wait(0, deps=[acc])  # the tail's decode may reuse the loop's in-flight A registers: retire them first
            acc = _step(vals, scs, toks, full, empty, acc, t, steps > 1, STAGES, DOWN)
            t += 1
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index((t + STAGES - 1) % STAGES))  # the item's last slot
        tile = w // n_blk
        if DOWN:
            _down_rows(acc, p_out, stride_out, p_rows, tile, (w % n_blk) * (2 * _BN), gl.load(p_tile_rows + tile))
        else:
            _epilogue(acc, p_out, stride_out, tile, (w % n_blk) * _BN, gl.load(p_tile_rows + tile), limit)


@gluon.jit
def _unit_offsets(o_u, e, n0, i, I, N16, K64, DOWN: gl.constexpr):
    """Byte offsets / 512 of K step i's units o_u (kb * 8 + stacked row unit: gate/up's 4 gate, then
    4 up; down's 8 consecutive)."""
    if DOWN:
        row = e * N16 + n0 // 16 + o_u % 8
    else:
        row = e * N16 + gl.where(o_u % 8 < 4, n0 // 16, (I + n0) // 16) + o_u % 4
    return row * K64 + 2 * i + o_u // 8


@gluon.jit
def _producer(p_in, p_w, p_s, p_rows, p_tile_expert, p_tile_rows, p_meta, vals, scs, toks, full, empty,
              stride_in, num_progs, n_blk, I, N16, K64, TOPK: gl.constexpr, STAGES: gl.constexpr,
              DOWN: gl.constexpr):
    """Per item: its tile's expert and slots; per K step: wait `empty`, cp.async the units, scales
    and tokens into the slot, arrive on `full` when this thread's copies land (noinc). p_in is x
    (gate/up: the tile's token rows, gathered) or act (down: the tile's 16 columns, K rows)."""
    lw: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [1, 1], [1, 0])  # a lane: 16 bytes a unit
    ls: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [1, 1], [1, 0])  # one 16-byte copy a lane
    lx: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [1, 1], [1, 0])  # 16 bytes a lane: 8 rows of x, or 8 columns of act
    o_uw = gl.arange(0, _UNITS, layout=gl.SliceLayout(1, lw))
    o_bw = gl.arange(0, 512, layout=gl.SliceLayout(0, lw))
    o_us = gl.arange(0, _UNITS, layout=gl.SliceLayout(1, ls))
    o_bs = gl.arange(0, 32, layout=gl.SliceLayout(0, ls))
    n_items = gl.load(p_meta) * n_blk
    t = 0
    for w in range(gl.program_id(0), n_items, num_progs):
        tile = w // n_blk
        e = gl.load(p_tile_expert + tile).to(gl.int64)
        if DOWN:
            n0 = (w % n_blk) * (2 * _BN)
            # every column of the tile is read: a column past its slots stays in its own output column, never stored
            o_k = gl.arange(0, _BK, layout=gl.SliceLayout(1, lx))
            o_m = gl.arange(0, _BM, layout=gl.SliceLayout(0, lx))
            p_tok = p_in + o_k.to(gl.int64)[:, None] * stride_in + (tile * _BM + o_m)[None, :]
        else:
            n0 = (w % n_blk) * _BN
            o_m = gl.arange(0, _BM, layout=gl.SliceLayout(1, lx))
            o_k = gl.arange(0, _BK, layout=gl.SliceLayout(0, lx))
            m_row = o_m < gl.load(p_tile_rows + tile)
            slot = gl.load(p_rows + tile * _BM + o_m, mask=m_row, other=0)  # rows past the count: unwritten
            p_tok = p_in + (slot // TOPK).to(gl.int64)[:, None] * stride_in + o_k[None, :]
        for i in range(K64 // 2):
            s = t % STAGES
            mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)  # the first pass finds it free
            unit = _unit_offsets(o_uw, e, n0, i, I, N16, K64, DOWN)
            cp.async_copy_global_to_shared(vals.index(s), p_w + unit[:, None] * 512 + o_bw[None, :])
            unit = _unit_offsets(o_us, e, n0, i, I, N16, K64, DOWN)
            cp.async_copy_global_to_shared(scs.index(s), p_s + unit[:, None] * 32 + o_bs[None, :])
            if DOWN:
                cp.async_copy_global_to_shared(toks.index(s), p_tok)
                p_tok += _BK * stride_in  # in place: a fresh pointer tensor a step spills the producer's 56 registers
            else:
                cp.async_copy_global_to_shared(toks.index(s), p_tok + i * _BK, mask=m_row[:, None])  # masked: zeros
            cp.mbarrier_arrive(full.index(s), increment_count=False)
            t += 1


@gluon.jit
def _ws_gemm(p_in, p_w, p_s, p_rows, p_tile_expert, p_tile_rows, p_meta, p_out, stride_in, stride_out, limit,
             num_progs, n_blk, I, N16, K64, TOPK: gl.constexpr, STAGES: gl.constexpr, PREGS: gl.constexpr,
             DOWN: gl.constexpr):
    """The ring (weights, scales, tokens a slot) and its barriers, then the two partitions."""
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])  # a slot's rank
    vals = gl.allocate_shared_memory(gl.uint8, [STAGES, _UNITS, 512], flat)
    scs = gl.allocate_shared_memory(gl.uint8, [STAGES, _UNITS, 32], flat)
    if DOWN:  # wgmma's B [K, N] N-major: act's rows
        tok_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_BK, _BM], gl.bfloat16)
        toks = gl.allocate_shared_memory(gl.bfloat16, [STAGES, _BK, _BM], tok_l)
    else:  # K-major: x's rows
        tok_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_BM, _BK], gl.bfloat16)
        toks = gl.allocate_shared_memory(gl.bfloat16, [STAGES, _BM, _BK], tok_l)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(full.index(s), count=32)  # every producer thread's noinc arrive
        mbarrier.init(empty.index(s), count=1)  # Gluon's arrive: a partition barrier, then one thread
    fence_async_shared()
    gl.warp_specialize([(_consumer, (vals, scs, toks, full, empty, p_rows, p_tile_rows, p_meta, p_out, stride_out,
                                     limit, num_progs, n_blk, K64, STAGES, DOWN)),
                        (_producer, (p_in, p_w, p_s, p_rows, p_tile_expert, p_tile_rows, p_meta, vals, scs, toks,
                                     full, empty, stride_in, num_progs, n_blk, I, N16, K64, TOPK, STAGES, DOWN))],
                       [1], [PREGS])  # one producer warp


# Two kernels of one body, so that a profile names each GEMM (and reads both as MoE: analysis/classify.py)
@gluon.jit
def _moe_up_ws_kernel(p_x, p_w, p_s, p_rows, p_tile_expert, p_tile_rows, p_meta, p_act, stride_xm, stride_act, limit,
                      num_progs, n_blk, I, N16, K64, TOPK: gl.constexpr, STAGES: gl.constexpr, PREGS: gl.constexpr):
    _ws_gemm(p_x, p_w, p_s, p_rows, p_tile_expert, p_tile_rows, p_meta, p_act, stride_xm, stride_act, limit,
             num_progs, n_blk, I, N16, K64, TOPK, STAGES, PREGS, False)


@gluon.jit
def _moe_down_ws_kernel(p_act, p_w, p_s, p_rows, p_tile_expert, p_tile_rows, p_meta, p_down, stride_act, stride_dm,
                        limit, num_progs, n_blk, I, N16, K64, TOPK: gl.constexpr, STAGES: gl.constexpr,
                        PREGS: gl.constexpr):
    _ws_gemm(p_act, p_w, p_s, p_rows, p_tile_expert, p_tile_rows, p_meta, p_down, stride_act, stride_dm, limit,
             num_progs, n_blk, I, N16, K64, TOPK, STAGES, PREGS, True)


def launch_options(ctas: int) -> dict:
    """num_warps (the consumer warpgroup) and the register cap letting `ctas` programs share an SM:
    a program holds 8 warps (the producer pads to a warpgroup); setmaxnreg then gives the consumer
    what the producer's PRODUCER_REGS leave (2 programs: 128 a thread, consumer 256 - PRODUCER_REGS)."""
    regs = 65536 // (ctas * 32 * 8) // 8 * 8
    return {"num_warps": 4} | ({"maxnreg": regs} if regs < 256 else {})


def grid_size(max_items: int, sms: int, ctas: int) -> int:
    """Persistent programs: `ctas` an SM, never more than the most items a routing can give."""
    return max(1, min(ctas * sms, max_items))


def ws_runs_on(t: torch.Tensor) -> bool:
    """Whether the kernels can run on t's device: Triton 3.6's Gluon, an sm_90 GPU with its shared
    memory (not capped by DSV4OPT_SHARED_MEMORY_LIMIT), not interpreted."""
    if not (GLUON_API_OK and t.is_cuda and not interpreted()):
        return False
    limits = device_limits(t.device)
    return limits.capability[0] == 9 and limits.shared_per_block >= HOPPER_SHARED_PER_BLOCK


def ws_supported(x: torch.Tensor, packed13, block_m: int, slotwise: bool = False) -> bool:
    """Whether `ws_gate_up` covers this call: Triton 3.6's Gluon, an sm_90 GPU, bf16 tokens whose row
    stride is a multiple of 16 elements (16-byte cp.async; Triton specialises strides on 16), routed
    tiles of 16 slots (not slotwise), folded scales, K (x's width) a multiple of 128 equal to the
    weights' and I a multiple of 64. Otherwise the Triton kernel (`_moe_up_kernel`) stays."""
    if not ws_runs_on(x):
        return False
    d, I = x.shape[1], packed13.rows // 2
    return (x.dtype == torch.bfloat16 and x.stride(1) == 1 and x.stride(0) % 16 == 0 and x.data_ptr() % 16 == 0
            and block_m == BM and not slotwise and packed13.fold and d % BK == 0 and d == packed13.k64 * 64
            and I % BN == 0)


def ws_gate_up(x: torch.Tensor, routing, packed13, act: torch.Tensor, limit: float, topk: int,
               ctas: int = 2, stages: int = 4) -> None:
    """act[n, tile * 16 + m] = silu(min(g, limit)) * clamp(u, -limit, limit) for every routed slot, as
    `_moe_up_kernel` writes it with SPLIT = 1 (act: [I, P], P = routing.max_tiles * 16, x's dtype).
    routing: `kernel.route(ids, R, 16)`; its tile count stays on the device. Caller checks
    `ws_supported` first. No host synchronisation (CUDA-graph safe)."""
    I = packed13.rows // 2
    n_blk = I // BN
    progs = grid_size(routing.max_tiles * n_blk, sm_count(x.device), ctas)
    _moe_up_ws_kernel[(progs,)](x, packed13.values, packed13.scales, routing.rows, routing.tile_expert,
                                routing.tile_rows, routing.meta, act, x.stride(0), act.stride(0), limit, progs, n_blk,
                                I, packed13.n16, packed13.k64, TOPK=topk, STAGES=stages, PREGS=PRODUCER_REGS,
                                **launch_options(ctas))


def ws_down_supported(act: torch.Tensor, packed2, block_m: int, slotwise: bool = False) -> bool:
    """Whether `ws_down` covers this call: as `ws_supported`, on act [I, P] (bf16, P contiguous, its row
    stride a multiple of 16 elements), I (down's K) a multiple of 128 equal to the weights' and d a
    multiple of 128."""
    if not ws_runs_on(act):
        return False
    I, d = act.shape[0], packed2.rows
    return (act.dtype == torch.bfloat16 and act.stride(1) == 1 and act.stride(0) % 16 == 0 and act.data_ptr() % 16 == 0
            and block_m == BM and not slotwise and packed2.fold and I % BK == 0 and I == packed2.k64 * 64
            and d % DOWN_BN == 0)


def ws_down(act: torch.Tensor, routing, packed2, down: torch.Tensor, ctas: int = 2, stages: int = 4) -> None:
    """down[slot, n] = sum_i w2[e, n, i] act[i, tile * 16 + m] (fp32) for every routed slot (slot =
    routing.rows[tile * 16 + m]), as `_moe_down_kernel` writes it with SPLIT = 1 (down: [M * k, d], the
    combine kernel's input; other ranks' slots unwritten). Caller checks `ws_down_supported` first. No
    host synchronisation (CUDA-graph safe)."""
    n_blk = packed2.rows // DOWN_BN
    progs = grid_size(routing.max_tiles * n_blk, sm_count(act.device), ctas)
    _moe_down_ws_kernel[(progs,)](act, packed2.values, packed2.scales, routing.rows, routing.tile_expert,
                                  routing.tile_rows, routing.meta, down, act.stride(0), down.stride(0), 0.0, progs,
                                  n_blk, 0, packed2.n16, packed2.k64, TOPK=1, STAGES=stages, PREGS=PRODUCER_REGS,
                                  **launch_options(ctas))


PTX_COUNTS = {"wgmma_reg_a": r"wgmma\.mma_async\.sync\.aligned\.m64n16k16\.f32\.bf16\.bf16 \{[^}]*\}, \{",
              "wgmma": r"wgmma\.mma_async", "cp_async": r"cp\.async\.c[ag]\.shared\.global",
              "cp_async_zero_fill": r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 0x10, %r\d+;",  # src-size
              "cp_async_arrive_noinc": r"cp\.async\.mbarrier\.arrive\.noinc", "mbarrier": r"mbarrier\.",
              "fence_proxy_async": r"fence\.proxy\.async", "mul_bf16x2": r"mul\.rn\.bf16x2"}


def compile_report(stages: int = 4, ctas: int = 2, topk: int = 8, down: bool = False) -> dict:
    """Compile gate/up's kernel (or down's) for sm_90a (no GPU needed): ptxas registers and spills,
    setmaxnreg per partition, shared memory, what the PTX holds, SASS instructions a K step of the
    consumer's loop."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    out = ("p_down", "*fp32", "stride_act", "stride_dm") if down else ("p_act", "*bf16", "stride_xm", "stride_act")
    sig = {("p_act" if down else "p_x"): "*bf16", "p_w": "*u8", "p_s": "*u8", "p_rows": "*i32",
           "p_tile_expert": "*i32", "p_tile_rows": "*i32", "p_meta": "*i32", out[0]: out[1], out[2]: "i32",
           out[3]: "i32", "limit": "fp32", **{k: "i32" for k in ("num_progs", "n_blk", "I", "N16", "K64")}}
    const = dict(TOPK=topk, STAGES=stages, PREGS=PRODUCER_REGS)
    attrs = {(i,): [["tt.divisibility", 16]] for i in (*range(8), 8, 9)}  # pointers and strides as launches see them
    kernel = _moe_down_ws_kernel if down else _moe_up_ws_kernel
    src = GluonASTSource(kernel, {**sig, **{k: "constexpr" for k in const}}, const, attrs)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=launch_options(ctas))
    ptx = c.asm["ptx"]
    log = ptxas_log(ptx)
    setmaxnreg = [int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)]
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups()
    row = dict(stages=stages, ctas=ctas, warps=c.metadata.num_warps,
               launch_regs=int(re.search(r"Used (\d+) registers", log).group(1)), setmaxnreg=setmaxnreg,
               spill_store_bytes=int(spills[0]), spill_load_bytes=int(spills[1]), shared_bytes=c.metadata.shared,
               wgmma_serialized="C7512" in log)  # ptxas: a wait after every wgmma
    row |= {k: len(re.findall(p, ptx)) for k, p in PTX_COUNTS.items()}
    sass = listing(c)
    for part, op, steps in (("consumer", "HGMMA", 2), ("producer", "LDGSTS", 1)):  # the consumer's loop: 2 steps
        ops = tightest_loop(sass, op)
        if ops:
            row[f"{part}_sass_per_step"] = sum(ops.values()) / steps
            row[f"{part}_ops"] = dict(ops.most_common(12))
    return row


def compile_only_args(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """A Gluon kernel module's command line, which only compiles: --compile-only required (the GPU checks
    live with the grouped-moe tests and bench), and Triton 3.6's Gluon."""
    ap.add_argument("--compile-only", action="store_true", help="sm_90a compile figures (no GPU)")
    args = ap.parse_args()
    if not args.compile_only:
        ap.error("only --compile-only runs from here; the GPU checks live with the grouped-moe tests and bench")
    if not GLUON_API_OK:
        raise SystemExit(f"written against Triton 3.6's Gluon (Hopper API); this is Triton {triton.__version__}")
    return args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--ctas", type=int, default=2)
    ap.add_argument("--down", action="store_true", help="down's kernel instead of gate/up's")
    args = compile_only_args(ap)
    for k, v in compile_report(args.stages, args.ctas, down=args.down).items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
