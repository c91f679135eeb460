"""Tensor-core sparse-MLA decode: a tile of heads shares each KV tile, split-K with an LSE combine.

Maths, byte/FLOP accounting and tile choice: docs/kernels/mma_attn.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from dsv4opt.errors import DsvOptError
from dsv4opt.tritonlib import HOPPER_SHARED_PER_BLOCK, LN2, LOG2E, compile_only, device_limits, sm_count
from dsv4opt.workload.attention.simt import check_attention_inputs
from dsv4opt.optimizations.mma_attn.dispatch import FUSED_ENGINES, INTERPRETED, cache_engine, fused_engine
from dsv4opt.optimizations.mma_attn.operands import extra_offsets
from dsv4opt.workload.kvcache import KVCache

# Running max before any used slot: finite, so exp2(m_old - m_new) never evaluates inf - inf.
_NO_SCORE = tl.constexpr(-1.0e30)
LOG2E_ = tl.constexpr(LOG2E)
LN2_ = tl.constexpr(LN2)


@triton.jit
def _row_offsets(tok, in_x, x_delta, stride_kv, PS_W: tl.constexpr, PB_W: tl.constexpr, PS_X: tl.constexpr,
                 PB_X: tl.constexpr, FP8: tl.constexpr, DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr):
    """Where the rows of tokens `tok` [BK] start, relative to the window cache's first byte (FP8:
    the data record's and the scale record's byte offsets) or first element (bf16: the row's
    element offset, scale offset unused). Rows of the compressed cache (`in_x`) are `x_delta`
    bytes (elements) past it: both caches are read through one set of pointers."""
    if FP8:
        page_w, slot_w = tok // PS_W, tok % PS_W
        page_x, slot_x = tok // PS_X, tok % PS_X
        at = tl.where(in_x, x_delta + page_x * PB_X + slot_x * DATA_BYTES, page_w * PB_W + slot_w * DATA_BYTES)
        at_s = tl.where(in_x, x_delta + page_x * PB_X + PS_X * DATA_BYTES + slot_x * SCALE_BYTES,
                        page_w * PB_W + PS_W * DATA_BYTES + slot_w * SCALE_BYTES)
    else:
        at = tl.where(in_x, x_delta, 0) + tok * stride_kv
        at_s = at
    return at, at_s


@triton.jit
def _load_latent_cols(p_kv, p_kv8, p_kv32, p_kv16, at, at_s, m_row, c0, W: tl.constexpr,
                      DN: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr, TILE: tl.constexpr):
    """Columns [c0, c0 + W) of the latent rows starting at `at` (masked rows read nothing and
    give 0), in q's dtype. FP8 layout: the columns as W / TILE tiles, the nope tiles e4m3 times
    their UE8M0 scale (read as the 32-bit word holding the tile's exponent byte, so the load is
    wide enough for an asynchronous copy), the tile past the nope the bf16 rope; dequantised in
    registers in q's dtype (exact: the scales are powers of two)."""
    dt = p_kv.dtype.element_ty
    if FP8 and W == TILE:
        # one tile: a [BK, TILE] load, e4m3 nope or (the tile past the nope) the bf16 rope
        NOPE_TILES1: tl.constexpr = DN // TILE
        o_e = tl.arange(0, TILE)
        t = c0 // TILE
        m_n = m_row & ((at * 0 + t) < NOPE_TILES1)  # a tensor compare (the interpreter refuses a scalar mask)
        m_r = m_row & ((at * 0 + t) == NOPE_TILES1)
        b_nope = tl.load(p_kv8 + (at + c0)[:, None] + o_e[None, :], mask=m_n[:, None], other=0.0)  # [BK, TILE]
        byte = at_s + t
        b_word = tl.load(p_kv32 + (byte >> 2), mask=m_n, other=127)  # [BK]
        b_e = ((b_word >> tl.where(m_n, (byte & 3) * 8, 0).to(tl.int32)) & 0xFF) - 127
        b_rope = tl.load(p_kv16 + ((at + DN) // 2)[:, None] + o_e[None, :], mask=m_r[:, None], other=0.0)  # [BK, TILE]
        b_x = tl.where(m_r[:, None], b_rope.to(dt), b_nope.to(dt) * tl.exp2(b_e.to(tl.float32)).to(dt)[:, None])
    elif FP8:
        NT: tl.constexpr = W // TILE
        NOPE_TILES: tl.constexpr = DN // TILE
        o_t = c0 // TILE + tl.arange(0, NT)  # [NT] tile numbers
        o_e = tl.arange(0, TILE)
        m_t = m_row[:, None] & (o_t < NOPE_TILES)[None, :]  # [BK, NT]
        col = o_t[:, None] * TILE + o_e[None, :]  # [NT, TILE]
        b_nope = tl.load(p_kv8 + at[:, None, None] + col[None, :, :], mask=m_t[:, :, None], other=0.0)  # [BK, NT, TILE]
        byte = at_s[:, None] + o_t[None, :]  # [BK, NT] the tile's exponent byte (may be < 0: shifts, not //)
        b_word = tl.load(p_kv32 + (byte >> 2), mask=m_t, other=127)  # [BK, NT] int32
        b_shift = tl.where(m_t, (byte & 3) * 8, 0).to(tl.int32)  # masked tiles keep other=127: exponent 0
        b_e = ((b_word >> b_shift) & 0xFF) - 127
        m_rope = m_row & ((at * 0 + c0 + W) > DN)  # a tensor compare: the interpreter refuses a scalar mask
        b_rope = tl.load(p_kv16 + ((at + DN) // 2)[:, None] + o_e[None, :], mask=m_rope[:, None], other=0.0)  # [BK, TILE]
        b_x = tl.where((o_t == NOPE_TILES)[None, :, None], b_rope.to(dt)[:, None, :],
                       b_nope.to(dt) * tl.exp2(b_e.to(tl.float32)).to(dt)[:, :, None])  # [BK, NT, TILE]
        b_x = tl.reshape(b_x, [at.shape[0], W])
    else:
        o_c = c0 + tl.arange(0, W)
        b_x = tl.load(p_kv + at[:, None] + o_c[None, :], mask=m_row[:, None] & (o_c[None, :] < D), other=0.0)
    return b_x


@triton.jit
def split_slots(p_len, i_b, i_s, len_x_delta, KW: tl.constexpr, KX: tl.constexpr, NSPLIT: tl.constexpr,
                BK: tl.constexpr):
    """Split i_s's share of request i_b's used slots: (n_w, start, end). The used slots are the
    window's [0, n_w) then the compressed cache's [0, n_x) (lengths clamped to the rows' widths KW,
    KX), numbered 0 .. n_w + n_x as one range; NSPLIT splits take whole BK-slot tiles of it in
    turn, so a program's trip count follows its request's lengths, not the rows' width, and a
    split past the end gets start >= end (nothing to do). Read on the device: no host sync."""
    n_w = tl.minimum(tl.maximum(tl.load(p_len + i_b), 0), KW)
    n = n_w
    if KX > 0:
        n += tl.minimum(tl.maximum(tl.load(p_len + len_x_delta + i_b), 0), KX)
    per = tl.cdiv(tl.cdiv(n, NSPLIT), BK) * BK
    start = i_s * per
    return n_w, start, tl.minimum(start + per, n)


@triton.jit
def _tile_slots(p_idx, o_k, i_b, n_w, end, idx_x_delta, stride_iw, stride_ix):
    """Token numbers [BK] of used-slot numbers o_k (below n_w the window's slot o_k, from n_w the
    compressed cache's slot o_k - n_w; -1 at or past `end`, or where the row says -1) and which of
    them are in the compressed cache."""
    in_x = o_k >= n_w
    o_i = tl.where(in_x, idx_x_delta + i_b * stride_ix + (o_k - n_w), i_b * stride_iw + o_k)
    return tl.load(p_idx + o_i, mask=o_k < end, other=-1), in_x


@triton.jit
def _tile_step(p_kv, p_kv8, p_kv32, p_kv16, p_idx, b_q, p_q_tile, m_hq, b_m, b_l, b_acc, k0, i_b, i_v, n_w, end,
               idx_x_delta, stride_iw, stride_ix, stride_kv, x_delta, qk_scale_log2, PS_W: tl.constexpr,
               PB_W: tl.constexpr, PS_X: tl.constexpr, PB_X: tl.constexpr, DN: tl.constexpr, D: tl.constexpr,
               D_P: tl.constexpr, FP8: tl.constexpr, TILE: tl.constexpr, DATA_BYTES: tl.constexpr,
               SCALE_BYTES: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NV: tl.constexpr,
               RELOAD_V: tl.constexpr, BD: tl.constexpr):
    """One tile of used slots k0 .. k0 + BK: gather the rows, S = q K^T, the online softmax step
    (base 2, masked slots at -inf), acc = acc * alpha + P V. Returns (m, l, acc).

    BD == D_P: q is the tile `b_q` [BH, D_P] loaded once by the caller and the rows are gathered
    whole. BD < D_P (GPUs with less shared memory a block than Hopper): S is summed over D_P / BD
    column chunks, each chunk of q reloaded from `p_q_tile` (its [BH, BD] pointers at column 0;
    `m_hq` [BH] the heads to read; L1 hits after the first tile) beside the rows' same columns, so
    no [BH, D_P] or [BK, D_P] tile is ever staged in shared memory; the value columns are gathered
    apart."""
    o_k = k0 + tl.arange(0, BK)
    b_idx, in_x = _tile_slots(p_idx, o_k, i_b, n_w, end, idx_x_delta, stride_iw, stride_ix)  # [BK]
    m_row = b_idx >= 0
    tok = tl.where(m_row, b_idx, 0).to(tl.int64)  # caches can exceed 2^31 bytes
    at, at_s = _row_offsets(tok, in_x, x_delta, stride_kv, PS_W, PB_W, PS_X, PB_X, FP8, DATA_BYTES, SCALE_BYTES)
    if BD == D_P:
        b_k = _load_latent_cols(p_kv, p_kv8, p_kv32, p_kv16, at, at_s, m_row, 0, D_P, DN, D, FP8, TILE)  # [BK, D_P]
        b_s = tl.dot(b_q, tl.trans(b_k))  # [BH, BK]
    else:
        b_s = tl.zeros([p_q_tile.shape[0], BK], tl.float32)  # [BH, BK]
        for c0 in range(0, D_P, BD):
            o_c = c0 + tl.arange(0, BD)
            b_qc = tl.load(p_q_tile + c0, mask=m_hq[:, None] & (o_c < D)[None, :], other=0.0)  # [BH, BD]
            b_kc = _load_latent_cols(p_kv, p_kv8, p_kv32, p_kv16, at, at_s, m_row, c0, BD, DN, D, FP8, TILE)  # [BK, BD]
            b_s = tl.dot(b_qc, tl.trans(b_kc), acc=b_s)
    if RELOAD_V or NV > 1 or BD < D_P:
        # A second load of the same rows (L1/L2 hits): each load then feeds one MMA only.
        b_v = _load_latent_cols(p_kv, p_kv8, p_kv32, p_kv16, at, at_s, m_row, i_v * BV, BV, DN, D, FP8, TILE)  # [BK, BV]
    else:
        b_v = b_k
    b_s = b_s * qk_scale_log2
    b_s = tl.where(m_row[None, :], b_s, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))  # [BH]
    b_alpha = tl.exp2(b_m - b_m_new)  # [BH]
    b_p = tl.exp2(b_s - b_m_new[:, None])  # [BH, BK]
    b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
    b_acc = tl.dot(b_p.to(b_v.dtype), b_v, acc=b_acc * b_alpha[:, None])  # [BH, BV]
    return b_m_new, b_l, b_acc


@triton.jit
def _lse_of_scores(b_m, b_l):
    """Natural-log lse of the used slots' scores alone from a base-2 running max b_m and the sum
    b_l of 2^(score - b_m): +inf where nothing is used (b_l 0), as FlashMLA returns it."""
    m_any = b_l > 0
    return tl.where(m_any, (b_m + tl.log2(tl.where(m_any, b_l, 1.0))) * LN2_, float("inf"))


@triton.jit
def _mma_sparse_decode_kernel(
    p_q, p_kv, p_kv8, p_kv32, p_kv16, p_idx, p_len, p_sink, p_o, p_lse, p_o_part, p_lse_part,
    stride_qb, stride_qh, stride_kv, stride_iw, stride_ix, stride_ob, stride_oh,
    H, qk_scale_log2, x_delta, idx_x_delta, len_x_delta,
    KW: tl.constexpr, KX: tl.constexpr, NSPLIT: tl.constexpr,
    PS_W: tl.constexpr, PB_W: tl.constexpr, PS_X: tl.constexpr, PB_X: tl.constexpr,
    DN: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
    FP8: tl.constexpr, TILE: tl.constexpr, DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr,
    BH: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, RELOAD_V: tl.constexpr, WHILE_LOOP: tl.constexpr,
    ONE_TILE: tl.constexpr, LSE_WITH_SINK: tl.constexpr = True, BD: tl.constexpr = 0,
):
    """One program: request i_b, heads [i_h*BH, +BH), value columns [i_v*BV, +BV), split i_s of the
    request's used slots (`split_slots`: the window's then the compressed cache's, as one range).

    Both caches go through one launch: the compressed cache's rows, indices and lengths are read
    at fixed offsets (x_delta, idx_x_delta, len_x_delta) from the window cache's, so a split may
    cover slots of both. Its loop runs over its used slots only (a run-time trip count): rows
    sized wider than the lengths (SGLang's graph-width metadata) cost nothing past them. Scores always use the whole latent row; with BV < D_P the value columns
    are split over programs (smaller accumulator, more programs per SM; the rows they share come
    from L2). NSPLIT == 1 writes o and lse directly, the sink in o always and in lse only with
    LSE_WITH_SINK (without: the used slots' log-sum-exp, +inf where none is used, FlashMLA's);
    otherwise fp32 partials (o normalised by its own denominator, base-2 lse) into split i_s, which
    _attn_combine_splits_kernel merges with the sink.
    """
    NV: tl.constexpr = D_P // BV
    i_b = tl.program_id(0)
    i_h = tl.program_id(1) // NV
    i_v = tl.program_id(1) % NV
    i_s = tl.program_id(2)
    o_h = i_h * BH + tl.arange(0, BH)
    m_h = o_h < H
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < D
    n_w, start, end = split_slots(p_len, i_b, i_s, len_x_delta, KW, KX, NSPLIT, BK)
    m_busy = (o_h * 0 + start) < end  # [BH] (a tensor compare: a scalar one makes an int32 mask)
    QK_D: tl.constexpr = D_P if BD == 0 else BD  # the columns of q one product takes (BD: chunks of them)
    o_qd = tl.arange(0, QK_D)
    p_q_tile = p_q + i_b * stride_qb + o_h[:, None] * stride_qh + o_qd[None, :]  # [BH, QK_D]
    m_hq = m_h & m_busy  # [BH] the heads whose q is read: none if the split is idle
    if QK_D == D_P:
        b_q = tl.load(p_q_tile, mask=m_hq[:, None] & (o_qd < D)[None, :], other=0.0)  # [BH, D_P]
    else:
        b_q = 0.0  # unused: _tile_step reloads q a column chunk at a time

    b_m = tl.full([BH], _NO_SCORE, tl.float32)  # [BH] running max, base 2
    b_l = tl.zeros([BH], tl.float32)  # [BH]
    b_acc = tl.zeros([BH, BV], tl.float32)  # [BH, BV]
    # Run-time bounds: tiles past the split's used slots are never issued; -1 slots inside are masked.
    # A for loop is what Triton pipelines (num_stages); Triton 3.6's interpreter cannot run one to
    # a run-time bound (3.9's can), a while loop runs in both. ONE_TILE (no split can hold more
    # than one tile, whatever the lengths: the narrow rows at B <= 4): the tile straight, masked
    # where the split is idle, as the compile-time loop compiled (a run-time loop there is
    # software-pipelined for nothing: 1,380 B spilled against 212, ptxas for sm_90a, Triton 3.6).
    if ONE_TILE:
        b_m, b_l, b_acc = _tile_step(
            p_kv, p_kv8, p_kv32, p_kv16, p_idx, b_q, p_q_tile, m_hq, b_m, b_l, b_acc, start, i_b, i_v, n_w, end,
            idx_x_delta, stride_iw, stride_ix, stride_kv, x_delta, qk_scale_log2, PS_W, PB_W, PS_X, PB_X, DN, D,
            D_P, FP8, TILE, DATA_BYTES, SCALE_BYTES, BK, BV, NV, RELOAD_V, QK_D)
    elif WHILE_LOOP:
        k0 = start
        while k0 < end:
            b_m, b_l, b_acc = _tile_step(
                p_kv, p_kv8, p_kv32, p_kv16, p_idx, b_q, p_q_tile, m_hq, b_m, b_l, b_acc, k0, i_b, i_v, n_w, end,
                idx_x_delta, stride_iw, stride_ix, stride_kv, x_delta, qk_scale_log2, PS_W, PB_W, PS_X, PB_X, DN,
                D, D_P, FP8, TILE, DATA_BYTES, SCALE_BYTES, BK, BV, NV, RELOAD_V, QK_D)
            k0 += BK
    else:
        for k0 in range(start, end, BK):
            b_m, b_l, b_acc = _tile_step(
                p_kv, p_kv8, p_kv32, p_kv16, p_idx, b_q, p_q_tile, m_hq, b_m, b_l, b_acc, k0, i_b, i_v, n_w, end,
                idx_x_delta, stride_iw, stride_ix, stride_kv, x_delta, qk_scale_log2, PS_W, PB_W, PS_X, PB_X, DN,
                D, D_P, FP8, TILE, DATA_BYTES, SCALE_BYTES, BK, BV, NV, RELOAD_V, QK_D)

    m_o = m_h[:, None] & m_v[None, :]
    # every value slice computes the same lse; one writes it (a tensor compare: a scalar one makes
    # an int32 mask, which Triton 3.9's interpreter refuses)
    m_lse = m_h & ((o_h * 0 + i_v) == 0)
    if NSPLIT == 1:
        b_sink = tl.load(p_sink + o_h, mask=m_h, other=0.0).to(tl.float32) * LOG2E_
        b_top = tl.maximum(b_m, b_sink)  # [BH]
        b_w = tl.exp2(b_m - b_top)
        b_den = b_l * b_w + tl.exp2(b_sink - b_top)
        b_o = b_acc * (b_w / b_den)[:, None]
        p_o_tile = p_o + i_b * stride_ob + o_h[:, None] * stride_oh + o_v[None, :]
        tl.store(p_o_tile, b_o.to(p_o.dtype.element_ty), mask=m_o)
        if LSE_WITH_SINK:
            b_lse = (b_top + tl.log2(b_den)) * LN2_
        else:
            b_lse = _lse_of_scores(b_m, b_l)
        tl.store(p_lse + i_b * H + o_h, b_lse, mask=m_lse)
    else:
        m_any = b_l > 0
        b_o = b_acc / tl.where(m_any, b_l, 1.0)[:, None]
        b_lse2 = tl.where(m_any, b_m + tl.log2(tl.where(m_any, b_l, 1.0)), float("-inf"))
        row_part = (i_b * NSPLIT + i_s).to(tl.int64) * H + o_h  # [BH] rows of [B*NSPLIT*H]
        # no o where nothing was used (an idle split): its lse is -inf and the combine skips it
        tl.store(p_o_part + row_part[:, None] * D + o_v[None, :], b_o, mask=m_o & m_any[:, None])
        tl.store(p_lse_part + row_part, b_lse2, mask=m_lse)


@triton.jit
def _attn_combine_splits_kernel(
    p_o_part, p_lse_part, p_sink, p_o, p_lse,
    stride_ob, stride_oh, H,
    NSPLIT: tl.constexpr, NS_P: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, SPLIT_LOOP: tl.constexpr,
    LSE_WITH_SINK: tl.constexpr = True,
):
    """One program per (request, head): merge the NSPLIT partials (fp32 or bf16) and the sink
    (into o always, into lse only with LSE_WITH_SINK: `_lse_of_scores` otherwise).

    SPLIT_LOOP (bf16 partials): summed a split at a time in registers. Summed as one [NSPLIT, D]
    tile over its first axis, Triton spreads the splits over warps and reduces through shared
    memory, on bf16 partials with 8-way bank conflicts: three times the fp32 time (Nsight Compute).
    The tile form stays for fp32 partials, where the split loop was slower at B = 1 (20 splits).
    Figures: docs/kernels/mma_attn.md."""
    i_b = tl.program_id(0)
    i_h = tl.program_id(1)
    o_s = tl.arange(0, NS_P)
    m_s = o_s < NSPLIT
    o_d = tl.arange(0, D_P)
    m_d = o_d < D
    row_part = (i_b * NSPLIT + o_s).to(tl.int64) * H + i_h  # [NS_P] rows of [B*NSPLIT*H]
    b_lse2 = tl.load(p_lse_part + row_part, mask=m_s, other=float("-inf"))  # [NS_P]
    b_sink = tl.load(p_sink + i_h).to(tl.float32) * LOG2E_
    b_top = tl.maximum(tl.max(b_lse2, axis=0), b_sink)
    b_w = tl.exp2(b_lse2 - b_top)  # [NS_P], 0 for empty splits
    b_den = tl.sum(b_w, axis=0) + tl.exp2(b_sink - b_top)
    # an empty split's o is never read: the block-level kernel leaves it unwritten
    if SPLIT_LOOP:
        b_o = tl.zeros([D_P], dtype=tl.float32)
        row0 = (i_b * NSPLIT).to(tl.int64) * H + i_h
        for s in tl.static_range(NSPLIT):  # unrolled: the splits' loads go out together
            b_lse_s = tl.load(p_lse_part + row0 + s * H)
            m_used = m_d & ((tl.zeros([D_P], tl.float32) + b_lse_s) > float("-inf"))  # a tensor compare (interpreter)
            b_part = tl.load(p_o_part + (row0 + s * H) * D + o_d, mask=m_used, other=0.0).to(tl.float32)
            b_o += tl.exp2(b_lse_s - b_top) * b_part
    else:
        m_part = (m_s & (b_lse2 > float("-inf")))[:, None] & m_d[None, :]
        b_part = tl.load(p_o_part + row_part[:, None] * D + o_d[None, :], mask=m_part, other=0.0)
        b_o = tl.sum(b_part * b_w[:, None], axis=0)  # [D_P]
    tl.store(p_o + i_b * stride_ob + i_h * stride_oh + o_d, (b_o / b_den).to(p_o.dtype.element_ty), mask=m_d)
    if LSE_WITH_SINK:
        b_lse = (b_top + tl.log2(b_den)) * LN2_
    else:
        # its own maximum, not b_top: a sink far above the scores would underflow sum(b_w) to 0
        b_max = tl.max(b_lse2, axis=0)
        b_lse = _lse_of_scores(b_max, tl.sum(tl.exp2(b_lse2 - tl.maximum(b_max, _NO_SCORE)), axis=0))
    tl.store(p_lse + i_b * H + i_h, b_lse)


_INTERPRETED = INTERPRETED  # Triton chose interpreter or compiler when the kernels were defined


@dataclass(frozen=True)
class Tiles:
    """Launch configuration; `nsplit` programs share each (request, head tile)."""

    block_h: int
    block_k: int
    nsplit: int
    num_warps: int
    num_stages: int
    block_v: int = 0  # value columns per program; 0 = the whole latent
    reload_v: bool = False  # load the rows again for the PV product instead of reusing them
    block_d: int = 0  # columns of q K^T a product takes (0: the whole latent; less: summed in chunks)


# Tile families measured best on the H200 (docs/kernels/mma_attn.md). bf16 rows: from B = 16 up
# the whole-width family wins; at small B, splitting the value columns over programs gives a tiny
# problem four times the programs (QK is recomputed per slice). FP8 rows are dequantised in
# registers on their way to shared memory: 32-row tiles keep that staging small enough for three
# pipeline stages (two tiles in flight) next to the 64 x 512 fp32 accumulator.
TILE_DEFAULTS = {"block_k": 64, "num_warps": 8, "num_stages": 2, "block_v": 0, "reload_v": False, "split_factor": 1.0}
SMALL_BATCH_TILES = {"block_k": 32, "num_warps": 4, "num_stages": 4, "block_v": 128, "reload_v": True, "split_factor": 1.0}
FP8_TILES = {"block_k": 64, "num_warps": 8, "num_stages": 2, "block_v": 0, "reload_v": False, "split_factor": 1.0}
FP8_SMALL_BATCH_TILES = {"block_k": 32, "num_warps": 4, "num_stages": 3, "block_v": 128, "reload_v": True, "split_factor": 1.0}
SMALL_BATCH_MAX = 4
# Four-byte q (float32, the model's fp32 runs, e.g. the torch-compile gate): tiles twice as wide
# in shared memory. 16-row tiles fit 193 KiB of the H200's 227 (ptxas for sm_90a, Triton 3.6,
# both KV layouts); the bf16 family asks for 384 KiB and fails to launch.
WIDE_DTYPE_TILES = {"block_k": 16, "num_warps": 8, "num_stages": 2, "block_v": 0, "reload_v": False, "split_factor": 1.0}
# GPUs whose blocks get less shared memory than the families above need (sm_120, sm_89, sm_86: 99 KB
# a block, where they ask for 104-234 KiB): no [64, 512] tile of q or of the rows is staged. q K^T
# is summed over 64-column chunks in a run-time loop (q's chunk reloaded each time, an L1 hit; an
# unrolled loop holds every chunk's loads at once and spills) and the value columns are split over
# four programs. 12-16 KiB of shared memory, 152-250 registers, no spills for sm_120a (Triton 3.9,
# tests/compile/); docs/kernels/mma_attn.md "GPUs with less shared memory".
CHUNKED_TILES = {"block_k": 32, "num_warps": 8, "num_stages": 1, "block_v": 128, "reload_v": True, "split_factor": 1.0,
                 "block_d": 64}


def choose_tiles(batch: int, heads: int, topk: int, device: torch.device, dim: int = 512, fp8: bool = False,
                 itemsize: int = 2, chunked: bool = False) -> Tiles:
    """Tiles from B, H and K (all the slots one launch covers): 64-head tiles (Hopper's MMA wants
    64 rows), then split the slots until about `split_factor` programs per SM; at large B a single
    pass needs no partials. K only caps the splits at one tile each: rows sized to SGLang's graph
    width (K ~ 8,320) get the splits the SM count asks for, and each split's share of the used
    slots is worked out in the kernel from the lengths (`split_slots`). `itemsize`: bytes per
    element of q (the dtype the products run in). `chunked`: the family for GPUs with less shared
    memory a block (CHUNKED_TILES)."""
    small = batch <= SMALL_BATCH_MAX
    d = (FP8_SMALL_BATCH_TILES if small else FP8_TILES) if fp8 else (SMALL_BATCH_TILES if small else TILE_DEFAULTS)
    if itemsize > 2:
        d = WIDE_DTYPE_TILES
    if chunked:
        d = CHUNKED_TILES
    block_h = min(64, max(16, triton.next_power_of_2(heads)))
    d_p = triton.next_power_of_2(dim)
    block_v = d["block_v"] if d["block_v"] and d_p % d["block_v"] == 0 else 0
    sms = sm_count(device) if device.type == "cuda" or compile_only() else 132
    programs = batch * triton.cdiv(heads, block_h) * (d_p // block_v if block_v else 1)
    nsplit = max(1, min(round(d["split_factor"] * sms / programs), triton.cdiv(topk, d["block_k"])))
    return Tiles(
        block_h=block_h, block_k=d["block_k"], nsplit=nsplit, num_warps=d["num_warps"],
        num_stages=d["num_stages"], block_v=block_v, reload_v=d["reload_v"],
        block_d=d.get("block_d", 0) if d.get("block_d", 0) < d_p else 0,
    )


def split_chunks(topk: int, block_k: int, nsplit: int) -> tuple[int, int]:
    """(slots per split, splits) for `nsplit` requested splits of `topk` slots: whole tiles per
    split, and no split left with an empty range when every slot is used. The kernels split each
    request's used slots the same way at run time (`split_slots`), so with every slot used they
    run exactly these chunks; with fewer, less."""
    nsplit = max(1, min(nsplit, triton.cdiv(topk, block_k)))
    chunk = triton.cdiv(triton.cdiv(topk, nsplit), block_k) * block_k
    return chunk, triton.cdiv(topk, chunk)


@dataclass(frozen=True)
class Plan:
    """How one call runs (dispatch.py decides the engine): "gluon-fp8-ws" and "gluon-ws" are one
    launch of kernel_gluon_fp8_ws.py / kernel_gluon_bf16_ws.py over the slots of both caches
    (window first), "triton" one launch of this file's kernel over the same slots; "gluon" is
    kernel_gluon.py once per cache (`per_cache`: tiles, chunk and splits of each). The Gluon loops
    write partials, merged by the combine. `chunk`: the slots a split runs when every slot of the
    rows is used (the most it can run); each launch splits each request's used slots over the
    `nsplit` programs on the device (`split_slots`)."""

    engine: str
    tiles: Tiles
    chunk: int
    nsplit: int
    per_cache: tuple[tuple[Tiles, int, int], ...] = ()


def plan(q, swa: KVCache, swa_indices, extra: KVCache | None, extra_indices, tiles: Tiles | None = None,
         chunked: bool = False) -> Plan:
    """The launch plan of one call with the tiles of the device's family (`fitting_plan` checks they
    fit its shared memory); `chunked`: the block-level kernel with CHUNKED_TILES, engine "triton-chunked"."""
    B, H, D = q.shape
    caches = [(swa, swa_indices)] + ([(extra, extra_indices)] if extra is not None else [])
    K = sum(indices.shape[1] for _, indices in caches)
    # one launch over both caches' slots: the chunks of every engine but "gluon"
    fused = tiles or choose_tiles(B, H, K, q.device, D, fp8=swa.layout.fp8, itemsize=q.element_size(),
                                  chunked=chunked)
    chunk, nsplit = split_chunks(K, fused.block_k, fused.nsplit)
    fused = replace(fused, nsplit=nsplit)
    if chunked:
        return Plan("triton-chunked", fused, chunk, nsplit)
    engine = fused_engine(q, swa, swa_indices, extra, extra_indices, fused)
    if engine:
        return Plan(engine, fused, chunk, nsplit)
    per_cache = []  # bf16 rows the one-launch loop does not take: kernel_gluon.py per cache, if both can
    for cache, indices in caches:
        t = tiles or choose_tiles(B, H, indices.shape[1], q.device, D, itemsize=q.element_size())
        c, n = split_chunks(indices.shape[1], t.block_k, t.nsplit)
        per_cache.append((replace(t, nsplit=n), c, n))
    if all(cache_engine(q, cache, indices, t) == "gluon" for (cache, indices), (t, _, _) in zip(caches, per_cache)):
        return Plan("gluon", per_cache[0][0], per_cache[0][1], sum(n for _, _, n in per_cache), tuple(per_cache))
    return Plan("triton", fused, chunk, nsplit)


# (device, the launch's constants, dtypes) -> bytes of shared memory a block of that launch asks for
_SHARED_BYTES: dict[tuple, int] = {}


def fitting_plan(q, swa: KVCache, swa_indices, swa_lengths, extra: KVCache | None, extra_indices, extra_lengths,
                 sink, scale, lse_with_sink: bool = True) -> Plan:
    """`plan` for q's device, by the shared memory its blocks may have (read from the device:
    tritonlib.device_limits): with Hopper's, the tile families measured there (Gluon loops where
    they apply); with less, the chunked family (the others fit by a hair at best there, and spill:
    tests/compile/). The block-level launch is checked against the limit before it is made: the
    chunked family where the usual one does not fit, a one-line refusal where neither does."""
    p = plan(q, swa, swa_indices, extra, extra_indices)
    if p.engine != "triton" or _INTERPRETED:
        return p  # the Gluon loops run only where the device has Hopper's shared memory (dispatch.py)
    limit = device_limits(q.device).shared_per_block
    chunked = plan(q, swa, swa_indices, extra, extra_indices, chunked=True)
    needs = []
    for candidate in ((p, chunked) if limit >= HOPPER_SHARED_PER_BLOCK else (chunked,)):
        needs.append(_shared_bytes(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths, sink,
                                   scale, candidate, lse_with_sink))
        if needs[-1] <= limit:
            return candidate
    raise DsvOptError(f"mma-attn cannot run on this GPU: its blocks get {limit:,} B of shared memory and the "
                      f"kernel's smallest tiles need {min(needs):,} B at B = {q.shape[0]}; leave mma-attn off")


def _shared_bytes(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths, sink, scale, p: Plan,
                  lse_with_sink: bool) -> int:
    """Shared memory a block of the block-level launch `p` asks for, from its compiled kernel (a
    compile without a launch; the sink stands in for the fp32 outputs, of the same dtype)."""
    launch = _fused_launch(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths, sink, scale, p,
                           q, sink, sink, sink, lse_with_sink)
    key = (q.device, q.dtype, swa.layout.fp8, tuple((k, v) for k, v in launch[1].items() if not k.startswith(("p_", "stride_"))))
    if key not in _SHARED_BYTES:
        _SHARED_BYTES[key] = _mma_sparse_decode_kernel.warmup(grid=launch[0], **launch[1]).metadata.shared
    return _SHARED_BYTES[key]


def _launch_fused(q, swa: KVCache, swa_indices, swa_lengths, extra: KVCache | None, extra_indices, extra_lengths,
                  sink, scale, p: Plan, o, lse, o_part, lse_part, lse_with_sink: bool = True) -> None:
    """One launch over the window slots then the compressed-cache slots."""
    grid, args = _fused_launch(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths, sink, scale, p,
                               o, lse, o_part, lse_part, lse_with_sink)
    _mma_sparse_decode_kernel[grid](**args)


def _fused_launch(q, swa: KVCache, swa_indices, swa_lengths, extra: KVCache | None, extra_indices, extra_lengths,
                  sink, scale, p: Plan, o, lse, o_part, lse_part, lse_with_sink: bool) -> tuple[tuple, dict]:
    """The grid and arguments of the one launch over both caches' slots."""
    B, H, D = q.shape
    L, t = swa.layout, p.tiles
    d_p = triton.next_power_of_2(D)
    block_v = t.block_v or d_p
    assert d_p % block_v == 0, (d_p, block_v)
    LX = extra.layout if extra is not None else L
    assert (LX.fp8, LX.nope, LX.rope, LX.tile) == (L.fp8, L.nope, L.rope, L.tile), (L, LX)
    if L.fp8:
        assert L.rope == L.tile and L.nope % L.tile == 0 and d_p % L.tile == 0, L
        kv8, kvu8, kv16 = swa.views()
        kv, kv32, stride_kv = q, kvu8.view(torch.int32), 0  # p_kv only gives the kernel q's dtype to convert to
    else:
        kv = kv8 = kv32 = kv16 = swa.data
        stride_kv = swa.data.stride(0)
        assert extra is None or extra.data.stride(0) == stride_kv, (extra.data.stride(), stride_kv)
    x_delta, idx_x_delta, len_x_delta, stride_ix, kx = extra_offsets(swa, swa_indices, swa_lengths, extra,
                                                                     extra_indices, extra_lengths)
    grid = (B, triton.cdiv(H, t.block_h) * (d_p // block_v), p.nsplit)
    return grid, dict(
        p_q=q, p_kv=kv, p_kv8=kv8, p_kv32=kv32, p_kv16=kv16, p_idx=swa_indices, p_len=swa_lengths, p_sink=sink,
        p_o=o, p_lse=lse, p_o_part=o_part, p_lse_part=lse_part,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_kv=stride_kv, stride_iw=swa_indices.stride(0),
        stride_ix=stride_ix, stride_ob=o.stride(0), stride_oh=o.stride(1),
        H=H, qk_scale_log2=scale * LOG2E, x_delta=x_delta, idx_x_delta=idx_x_delta, len_x_delta=len_x_delta,
        KW=swa_indices.shape[1], KX=kx, NSPLIT=p.nsplit,
        PS_W=L.page_size, PB_W=L.page_bytes if L.fp8 else 0, PS_X=LX.page_size, PB_X=LX.page_bytes if L.fp8 else 0,
        DN=L.nope, D=D, D_P=d_p, FP8=L.fp8, TILE=L.tile, DATA_BYTES=L.data_bytes, SCALE_BYTES=L.scale_bytes,
        BH=t.block_h, BK=t.block_k, BV=block_v, RELOAD_V=t.reload_v, WHILE_LOOP=_INTERPRETED,
        ONE_TILE=p.chunk <= t.block_k,  # with every slot used a split runs p.chunk slots, the most it can
        LSE_WITH_SINK=lse_with_sink, BD=t.block_d if t.block_d and t.block_d < d_p else 0,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )


def mma_attention(q, swa: KVCache, swa_indices, swa_lengths, extra: KVCache | None, extra_indices,
                  extra_lengths, sink, scale, tiles: Tiles | None = None,
                  lse_with_sink: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The `attention` slot (dsv4opt/workload/slots.py) on tensor cores.

    One split-K launch covers the slots of both caches (a tile of 64 heads shares every KV tile
    read; FP8 rows are dequantised in registers); with a split, every split writes fp32 partials
    and one combine kernel merges them with the sink, else the single pass writes o and lse. Where
    a Gluon loop applies (dispatch.py) it replaces the main kernel, always with partials: the
    warp-specialised loops (FP8 or bf16 rows, one launch over both caches) write bf16 partials,
    kernel_gluon.py (bf16 rows, once per cache) fp32.
    lse_with_sink=False: lse is FlashMLA's instead, the log-sum-exp of the used slots' scores alone
    and +inf where none is used (o keeps the sink), written by the same launches.
    On a GPU whose blocks get less shared memory than Hopper's the block-level kernel runs its
    chunked tiles (`fitting_plan`); where no tiles fit, a one-line DsvOptError before any launch.
    CUDA-graph safe: no host synchronisation; allocations have shapes fixed by the inputs'.
    """
    if q.device.type != "cuda" and not _INTERPRETED and not compile_only():
        raise DsvOptError(
            "mma-attn runs on a CUDA GPU; on a CPU leave it off, or set TRITON_INTERPRET=1 (slow) to run it"
        )
    B, H, D = q.shape
    for cache, indices, lengths in [(swa, swa_indices, swa_lengths)] + ([(extra, extra_indices, extra_lengths)] if extra is not None else []):
        check_attention_inputs(q, indices, lengths)
        assert cache.layout.dim == D and (cache.layout.fp8 or cache.data.dtype == q.dtype), (cache.layout, q.dtype)
    assert sink.shape == (H,)
    p = (plan(q, swa, swa_indices, extra, extra_indices, tiles) if tiles is not None else
         fitting_plan(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths, sink, scale, lse_with_sink))
    ns_total = max(p.nsplit, 2) if p.engine == "gluon" else p.nsplit  # the Gluon loop always writes partials
    o = torch.empty_like(q)
    lse = torch.empty(B, H, device=q.device, dtype=torch.float32)
    fused_gluon = p.engine in FUSED_ENGINES  # bf16 partials; every program writes its lse rows: no fill
    if ns_total > 1:
        o_part = torch.empty(B, ns_total, H, D, device=q.device, dtype=torch.bfloat16 if fused_gluon else torch.float32)
        if fused_gluon:
            lse_part = torch.empty(B, ns_total, H, device=q.device, dtype=torch.float32)
        else:
            lse_part = torch.full((B, ns_total, H), float("-inf"), device=q.device, dtype=torch.float32)
    else:
        o_part, lse_part = o, lse  # unused by the single-pass kernel
    if p.engine == "gluon":
        from dsv4opt.optimizations.mma_attn.kernel_gluon import gluon_sparse_decode_partials

        base = 0
        caches = [(swa, swa_indices, swa_lengths), (extra, extra_indices, extra_lengths)]
        for (cache, indices, lengths), (_, _, nsplit) in zip(caches, p.per_cache):
            gluon_sparse_decode_partials(q, cache.data, indices, lengths, o_part, lse_part, nsplit, scale,
                                         split_base=base, ns_total=ns_total)
            base += nsplit
    elif fused_gluon:
        from dsv4opt.optimizations.mma_attn.kernel_gluon_bf16_ws import gluon_bf16_ws_sparse_decode_partials
        from dsv4opt.optimizations.mma_attn.kernel_gluon_fp8_ws import gluon_fp8_ws_sparse_decode_partials

        fp8 = p.engine == "gluon-fp8-ws"
        launch = gluon_fp8_ws_sparse_decode_partials if fp8 else gluon_bf16_ws_sparse_decode_partials
        launch(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths, o_part, lse_part, p.nsplit,
               scale)
    else:
        _launch_fused(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths, sink, scale, p,
                      o, lse, o_part, lse_part, lse_with_sink)
    if ns_total > 1:
        combine_splits(o_part, lse_part, sink, o, lse, lse_with_sink)
    return o, lse


def combine_splits(o_part: torch.Tensor, lse_part: torch.Tensor, sink: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, lse_with_sink: bool = True) -> None:
    """Merge o_part [B, S, H, D] (fp32 or bf16) and lse_part [B, S, H] (base 2) with the sink [H]
    into o [B, H, D] and lse [B, H] (natural log; without the sink, +inf where nothing is used,
    when not lse_with_sink): one program per (request, head)."""
    B, S, H, D = o_part.shape
    _attn_combine_splits_kernel[(B, H)](
        p_o_part=o_part, p_lse_part=lse_part, p_sink=sink, p_o=o, p_lse=lse,
        stride_ob=o.stride(0), stride_oh=o.stride(1), H=H,
        NSPLIT=S, NS_P=triton.next_power_of_2(S), D=D, D_P=triton.next_power_of_2(D),
        SPLIT_LOOP=o_part.dtype != torch.float32, LSE_WITH_SINK=lse_with_sink, num_warps=4,
    )
