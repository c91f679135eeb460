"""mma-attn's main loop for SGLang's FP8 KV layout, in Gluon (Hopper): gathers two tiles ahead.

The block-level kernel (kernel.py) dequantises FP8 rows in registers on their way to the tensor
cores, and Triton's pipeliner keeps one tile in flight for that gather -> dequantise -> MMA chain.
Here the schedule is written out. The indices are read into a ring of tile rows in shared memory
a few tiles ahead (so no gather address waits on a global load, whatever the rows' width); the raw
bytes of each selected row (448 e4m3 nope bytes, 128 rope bytes, the 8-byte scale record) are
gathered by cp.async into two staging buffers: tile t + 1's are in flight while tile t is
dequantised, tiles t + 1's and t + 2's while it is multiplied. Per tile: staged bytes -> registers -> bf16 (e4m3 times 2^(exp - 127), exact: the
scales are powers of two; the rope is bf16 already) -> one NVMMA-swizzled [BK, 512] bf16 tile ->
QK and PV wgmma as in kernel_gluon.py. The buffer a tile was staged in is refilled with tile
t + NBUF as soon as every warp has read it, before the MMAs, so the gather of two tiles overlaps
the products of one.

One launch covers both caches, as kernel.py's main kernel does (the compressed cache's rows,
indices and lengths at fixed offsets from the window cache's), with the same splits of each
request's used slots (`split_slots`, kernel.py's on the device: run-time trip counts, so rows sized
to SGLang's graph width cost per used slot); it writes the same fp32 partials (o normalised by its
split's denominator, base-2 lse; o = 0 and lse -inf for a split with no used slot), which
kernel.py's combine merges with the sink. With MERGE (kernel.GLUON_FP8_MERGE_IN_KERNEL,
off until a GPU run validates it) each request's last program to finish does that merge itself,
found by an atomic count per request, so one launch writes o and lse.

GPU only (the interpreter cannot run Gluon), Triton 3.6 only (kernel.GLUON_VALIDATED_TRITON), and
off by default in the dispatch (kernel.GLUON_FP8_ENABLED) until a GPU run validates it; design and
offline compile figures in docs/kernels/mma_attn.md.
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from dsv4opt.tritonlib import LN2, LOG2E

# The geometry this loop is written for (DeepSeek-V4-Flash's FP8 layout, kvcache.py): 7 tiles of 64
# e4m3 nope values, 64 bf16 rope values, 576-byte data records and 8-byte scale records.
NOPE_TILES = 7
TILE = 64
ROPE = 64
DATA_BYTES = 576
SCALE_BYTES = 8
HEADS = 64  # one warpgroup's MMA rows
BLOCK_K = 64
NUM_BUF = 2  # staging buffers: q 64 KB + bf16 tile 64 KB + 2 x 36.5 KB of FP8 bytes fit 227 KB; 3 do not
# Tile rows of indices in shared memory, a ring (1 KiB): the loops read tile t's row (scores' mask)
# and issue tile t + 2's gather, and refill the row of a tile every warp is past with one read
# ahead into registers, so the staging does not grow with the rows' width.
IDX_RING = 4

# the chunk's indices in shared memory, flat, viewed as rows of a tile (or of a sub-tile)
IDX_SMEM = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
# the same, for the kernels (Triton reads globals only as constexprs)
_NOPE_TILES = gl.constexpr(NOPE_TILES)
_TILE = gl.constexpr(TILE)
_ROPE = gl.constexpr(ROPE)
_DATA_BYTES = gl.constexpr(DATA_BYTES)
_SCALE_BYTES = gl.constexpr(SCALE_BYTES)
LOG2E_ = gl.constexpr(LOG2E)
LN2_ = gl.constexpr(LN2)
IDX_RING_ = gl.constexpr(IDX_RING)


@gluon.jit
def split_slots(p_len, i_b, i_s, len_x_delta, KW: gl.constexpr, KX: gl.constexpr, NSPLIT: gl.constexpr,
                BK: gl.constexpr):
    """kernel.split_slots in Gluon (the same sums; that one is tested on the CPU): split i_s's share
    of request i_b's used slots, the window's [0, n_w) then the compressed cache's (lengths clamped
    to the widths KW, KX) numbered as one range, in whole BK-slot tiles. Returns (n_w, start, end,
    its tiles); a split past the end has none."""
    n_w = gl.minimum(gl.maximum(gl.load(p_len + i_b), 0), KW)
    n = n_w
    if KX > 0:
        n += gl.minimum(gl.maximum(gl.load(p_len + len_x_delta + i_b), 0), KX)
    per = gl.cdiv(gl.cdiv(n, NSPLIT), BK) * BK
    start = i_s * per
    end = gl.minimum(start + per, n)
    return n_w, start, end, gl.cdiv(gl.maximum(end - start, 0), BK)


@gluon.jit
def tile_indices(p_idx, i_b, pos0, end, n_w, stride_iw, stride_ix, idx_x_delta, N: gl.constexpr,
                 L: gl.constexpr):
    """Token numbers [N] (layout L) of request i_b's used slots pos0 .. pos0 + N: below n_w the
    window's slot, from n_w the compressed cache's slot - n_w (its indices idx_x_delta past the
    window's); -1 at or past `end` and where the row says -1."""
    o_k = pos0 + gl.arange(0, N, layout=L)
    in_x = o_k >= n_w
    o_i = gl.where(in_x, idx_x_delta + i_b * stride_ix + (o_k - n_w), i_b * stride_iw + o_k)
    return gl.load(p_idx + o_i, mask=o_k < end, other=-1)


@gluon.jit
def _tile_rows(idx_rows, row, pos0, n_w, x_delta, ROWS: gl.constexpr, PS_W: gl.constexpr,
               PB_W: gl.constexpr, PS_X: gl.constexpr, PB_X: gl.constexpr, BK: gl.constexpr):
    """Byte offsets [BK] (int64, from the window cache's first byte) of the data and scale records
    of the tokens in row `row` of idx_rows (used slots pos0 .. pos0 + BK), and which rows are used,
    in layout ROWS. Used slots from n_w on are the compressed cache's, whose bytes start x_delta
    past the window cache's."""
    b_idx = idx_rows.index(row).load(ROWS)  # [BK]
    m_row = b_idx >= 0
    tok = gl.where(m_row, b_idx, 0).to(gl.int64)  # caches can exceed 2^31 bytes
    in_x = (pos0 + gl.arange(0, BK, layout=ROWS)) >= n_w
    page_w = tok // PS_W
    slot_w = tok % PS_W
    page_x = tok // PS_X
    slot_x = tok % PS_X
    at = gl.where(in_x, x_delta + page_x * PB_X + slot_x * _DATA_BYTES, page_w * PB_W + slot_w * _DATA_BYTES)
    at_s = gl.where(in_x, x_delta + page_x * PB_X + PS_X * _DATA_BYTES + slot_x * _SCALE_BYTES,
                    page_w * PB_W + PS_W * _DATA_BYTES + slot_w * _SCALE_BYTES)
    return at, at_s, m_row


@gluon.jit
def _issue_tile(st_nope, st_rope, st_scale, p_kv8, p_kv16, p_kv32, idx_smem, t, buf, start, n_w, x_delta,
                PS_W: gl.constexpr, PB_W: gl.constexpr, PS_X: gl.constexpr, PB_X: gl.constexpr,
                BK: gl.constexpr, L_NOPE: gl.constexpr, L_ROPE: gl.constexpr, L_SCALE: gl.constexpr):
    """cp.async tile t's raw bytes into staging buffer `buf`: nope tile j of every row into
    st_nope[buf * 7 + j] [BK, 64] u8, the rope into st_rope[buf] [BK, 64] bf16, the scale record's
    two 32-bit words into st_scale[buf] [2, BK] i32. Unused rows (index -1) read nothing; cp.async
    zero-fills them, so they dequantise to 0 and their masked scores multiply finite values."""
    row, pos0 = t % IDX_RING_, start + t * BK  # tile t's row of the index ring, its first used slot
    at, _, m_row = _tile_rows(idx_smem, row, pos0, n_w, x_delta, gl.SliceLayout(1, L_NOPE), PS_W, PB_W, PS_X, PB_X, BK)
    o_c = gl.arange(0, _TILE, layout=gl.SliceLayout(0, L_NOPE))
    for j in gl.static_range(_NOPE_TILES):
        # 16 bytes a thread, 4 KB of one nope tile a call: contiguous in shared memory, no bank conflict
        cp.async_copy_global_to_shared(st_nope.index(buf * _NOPE_TILES + j), p_kv8 + (at + j * _TILE)[:, None] + o_c[None, :],
                                       mask=m_row[:, None])
    at_r, _, m_r = _tile_rows(idx_smem, row, pos0, n_w, x_delta, gl.SliceLayout(1, L_ROPE), PS_W, PB_W, PS_X, PB_X, BK)
    o_r = gl.arange(0, _ROPE, layout=gl.SliceLayout(0, L_ROPE))
    cp.async_copy_global_to_shared(st_rope.index(buf), p_kv16 + ((at_r + _NOPE_TILES * _TILE) >> 1)[:, None] + o_r[None, :],
                                   mask=m_r[:, None])
    _, at_s, m_s = _tile_rows(idx_smem, row, pos0, n_w, x_delta, gl.SliceLayout(0, L_SCALE), PS_W, PB_W, PS_X, PB_X, BK)
    o_w = gl.arange(0, 2, layout=gl.SliceLayout(1, L_SCALE))
    ROW2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    st_words = st_scale.index(buf)._reinterpret(gl.int32, [2, BK], ROW2)  # [2, BK]: word w of every row
    cp.async_copy_global_to_shared(st_words, p_kv32 + (at_s >> 2)[None, :] + o_w[:, None], mask=m_s[None, :])


@gluon.jit
def _dequant_tile(kv_smem, st_nope, st_rope, st_scale, buf, L_NOPE: gl.constexpr, L_ROPE: gl.constexpr):
    """Staging buffer `buf` -> the bf16 tile kv_smem [BK, 512]: nope tile j is e4m3 times
    2^(e_j - 127), e_j byte j % 4 of scale word j // 4; the scale is built as an fp32 with exponent
    field e_j (exactly 2^(e_j - 127)), so the product is exact in bf16."""
    ROWS: gl.constexpr = gl.SliceLayout(1, L_NOPE)
    BK: gl.constexpr = kv_smem.shape[0]
    b_w0 = st_scale.index(buf).slice(0, BK).load(ROWS)  # [BK] int32: exponent bytes of nope tiles 0-3
    b_w1 = st_scale.index(buf).slice(BK, BK).load(ROWS)  # [BK] int32: tiles 4-6 and the pad byte
    for j in gl.static_range(_NOPE_TILES):
        if j < 4:
            b_w = b_w0
        else:
            b_w = b_w1
        b_sc = (((b_w >> (8 * (j % 4))) & 0xFF) << 23).to(gl.float32, bitcast=True)  # [BK] 2^(e - 127); 0 for e = 0
        b_raw = st_nope.index(buf * _NOPE_TILES + j).load(L_NOPE)  # [BK, 64] uint8
        b_x = b_raw.to(gl.float8e4nv, bitcast=True).to(gl.float32) * b_sc[:, None]  # [BK, 64]
        kv_smem.slice(j * _TILE, _TILE, dim=1).store(b_x.to(gl.bfloat16))
    b_rope = st_rope.index(buf).load(L_ROPE)  # [BK, 64] bf16
    kv_smem.slice(_NOPE_TILES * _TILE, _ROPE, dim=1).store(b_rope)


@gluon.jit
def _tile_products(q_smem, kv_t, idx_smem, row, b_m, b_l, b_acc, qk_scale_log2, BH: gl.constexpr, BK: gl.constexpr):
    """One bf16 tile kv_t [BK, 512] of both warpgroups: S = q K^T, the online softmax (base 2, masked
    slots at -inf, the tile's indices in row `row` of idx_smem), acc = acc * alpha + P V. Returns (m, l, acc)."""
    S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BK // 2, 16])
    O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    P_DOT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_MMA, k_width=2)
    s_zero = gl.zeros([BH, BK], gl.float32, layout=S_MMA)
    b_s = warpgroup_mma(q_smem, kv_t.permute((1, 0)), s_zero, use_acc=False)  # [BH, BK]
    b_m_new, b_l, b_alpha, b_p = _online_softmax(b_s, idx_smem, row, b_m, b_l, qk_scale_log2)
    b_alpha_o = gl.convert_layout(b_alpha, gl.SliceLayout(1, O_MMA))
    p_dot = gl.convert_layout(b_p.to(gl.bfloat16), P_DOT)
    b_acc = warpgroup_mma(p_dot, kv_t, b_acc * b_alpha_o[:, None])  # [BH, D]; waits for its completion
    return b_m_new, b_l, b_acc


@gluon.jit
def _online_softmax(b_s, idx_smem, row, b_m, b_l, qk_scale_log2):
    """One tile's step of the online softmax on scores b_s [BH, BK] (in their MMA layout), base 2:
    slots whose index (row `row` of idx_smem) is -1 at -inf. Returns the new running max and
    sum, the rescale of what came before (alpha) and the tile's unnormalised P."""
    b_idx = idx_smem.index(row).load(gl.SliceLayout(0, b_s.type.layout))  # [BK]
    b_s = gl.where((b_idx >= 0)[None, :], b_s * qk_scale_log2, float("-inf"))
    b_m_new = gl.maximum(b_m, gl.max(b_s, axis=1))
    b_alpha = gl.exp2(b_m - b_m_new)  # [BH]
    b_p = gl.exp2(b_s - b_m_new[:, None])  # [BH, BK]
    return b_m_new, b_l * b_alpha + gl.sum(b_p, axis=1), b_alpha, b_p


@gluon.jit
def _split_result(p_lse_part, b_acc, b_m, b_l, i_b, i_s, H, NSPLIT: gl.constexpr, BH: gl.constexpr,
                  BK: gl.constexpr):
    """Stores split i_s's base-2 lse into lse_part [B, NSPLIT, H] (-inf for a chunk with no used
    slot) and returns its o normalised by its own denominator ([BH, D] fp32, the accumulator's
    layout) for the caller to store."""
    S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BK // 2, 16])
    O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    m_any = b_l > 0
    b_lse2 = gl.where(m_any, b_m + gl.log2(gl.where(m_any, b_l, 1.0)), float("-inf"))  # [BH]
    o_hs = gl.arange(0, BH, layout=gl.SliceLayout(1, S_MMA))
    gl.store(p_lse_part + (i_b * NSPLIT + i_s).to(gl.int64) * H + o_hs, b_lse2)
    inv = gl.convert_layout(1.0 / gl.where(m_any, b_l, 1.0), gl.SliceLayout(1, O_MMA))
    return b_acc * inv[:, None]


@gluon.jit
def _store_partials(p_o_part, p_lse_part, b_acc, b_m, b_l, i_b, i_s, H, NSPLIT: gl.constexpr, BH: gl.constexpr,
                    D: gl.constexpr, BK: gl.constexpr, store_o):
    """Split i_s's o (normalised by its own denominator) into o_part [B, NSPLIT, H, D] (fp32 here;
    the warp-specialised loops' bf16 partials go through kernel_gluon_fp8_ws._store_partials_staged),
    straight from the accumulator's layout, where `store_o` (an idle split's o is never read by
    kernel.py's combine), and its base-2 lse into lse_part [B, NSPLIT, H] always."""
    O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    b_o = _split_result(p_lse_part, b_acc, b_m, b_l, i_b, i_s, H, NSPLIT, BH, BK)  # [BH, D]
    if store_o:
        o_ho = gl.arange(0, BH, layout=gl.SliceLayout(1, O_MMA))
        o_do = gl.arange(0, D, layout=gl.SliceLayout(0, O_MMA))
        row_part = (i_b * NSPLIT + i_s).to(gl.int64) * H + o_ho
        gl.store(p_o_part + row_part[:, None] * D + o_do[None, :], b_o)


@gluon.jit
def _merge_if_last(p_o_part, p_lse_part, p_sink, p_o, p_lse, p_count, i_b, stride_ob, stride_oh, H,
                   NSPLIT: gl.constexpr, D: gl.constexpr, BH: gl.constexpr):
    """After this program's partials are stored: count it in p_count[i_b]; the request's last
    program (the one that reads NSPLIT - 1) merges every split of o_part [B, NSPLIT, H, D] fp32 and
    lse_part [B, NSPLIT, H] (base 2) with the sink into o [B, H, D] and lse [B, H], and puts the
    count back to 0 for the next launch.

    Ordering: the barrier puts every thread's partial stores before the count's atomic (one
    thread's, acq_rel at GPU scope: its release covers what the CTA stored before the barrier);
    the last program's acquire comes before its reads of the other programs' partials, which go
    through L2 (.cg), not this SM's L1."""
    gl.thread_barrier()
    count = gl.atomic_add(p_count + i_b, 1, sem="acq_rel", scope="gpu")
    if count == NSPLIT - 1:
        gl.store(p_count + i_b, 0)  # no other program of this launch touches it again
        # [BH, DC] fp32 column slices of 16 bytes a thread: 32 registers a tile, so the partials
        # stream through registers (the main loop's accumulator is dead here). Run-time loops over
        # the splits: unrolled, ten splits spilled.
        DC: gl.constexpr = 128
        M: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [gl.num_warps(), 1], [1, 0])
        HEAD: gl.constexpr = gl.SliceLayout(1, M)
        o_h = gl.arange(0, BH, layout=HEAD)
        o_c = gl.arange(0, DC, layout=gl.SliceLayout(0, M))
        row0 = (i_b * NSPLIT).to(gl.int64) * H  # split 0's first row of [B * NSPLIT * H]
        b_sink = gl.load(p_sink + o_h).to(gl.float32) * LOG2E_  # [BH] base 2
        b_top = b_sink
        for s in range(NSPLIT):
            b_top = gl.maximum(b_top, gl.load(p_lse_part + row0 + s * H + o_h, cache_modifier=".cg"))
        b_den = gl.exp2(b_sink - b_top)  # [BH]; the sink keeps b_top finite, so empty splits weigh 0
        for s in range(NSPLIT):
            b_den += gl.exp2(gl.load(p_lse_part + row0 + s * H + o_h, cache_modifier=".cg") - b_top)
        for c in gl.static_range(D // DC):
            b_o = gl.zeros([BH, DC], gl.float32, layout=M)  # [BH, DC]
            for s in range(NSPLIT):
                b_w = gl.exp2(gl.load(p_lse_part + row0 + s * H + o_h, cache_modifier=".cg") - b_top)  # [BH]
                p_part = p_o_part + (row0 + s * H + o_h)[:, None] * D + (c * DC + o_c)[None, :]
                b_o += gl.load(p_part, cache_modifier=".cg") * b_w[:, None]
            b_o = b_o / b_den[:, None]
            p_out = p_o + i_b * stride_ob + o_h[:, None] * stride_oh + (c * DC + o_c)[None, :]
            gl.store(p_out, b_o.to(p_o.dtype.element_ty))
        gl.store(p_lse + i_b * H + o_h, (b_top + gl.log2(b_den)) * LN2_)


@gluon.jit
def gluon_fp8_sparse_decode_kernel(
    p_q, p_kv8, p_kv16, p_kv32, p_idx, p_len, p_o_part, p_lse_part, p_sink, p_o, p_lse, p_count,
    stride_qb, stride_iw, stride_ix, stride_ob, stride_oh, H, qk_scale_log2, x_delta, idx_x_delta, len_x_delta,
    KW: gl.constexpr, KX: gl.constexpr, NSPLIT: gl.constexpr,
    PS_W: gl.constexpr, PB_W: gl.constexpr, PS_X: gl.constexpr, PB_X: gl.constexpr,
    D: gl.constexpr, BH: gl.constexpr, BK: gl.constexpr, NBUF: gl.constexpr, MERGE: gl.constexpr,
):
    """One program: request i_b, all BH heads, split i_s of the request's used slots (`split_slots`:
    of the KW window slots then the KX compressed-cache slots, as far as the lengths say); writes split i_s of o_part [B, NSPLIT, H, D] fp32
    and lse_part [B, NSPLIT, H] (base 2). MERGE: the request's last program to finish also merges
    its NSPLIT partials with the sink [H] into o [B, H, D] bf16 and lse [B, H] (natural log), as
    kernel.py's combine does, counting finished programs in p_count [B] int32 (0 on entry, left 0).
    Without MERGE p_sink, p_o, p_lse and p_count are not read."""
    gl.static_assert(gl.num_warps() == 8)
    gl.static_assert(BK == 64)
    gl.static_assert(D == _NOPE_TILES * _TILE + _ROPE)
    # 16 bytes a thread: one nope tile [64, 64] u8 is one pass of 256 threads; the rope [64, 64]
    # bf16 two; the scale words [2, 64] i32 one (4-byte copies, the narrowest cp.async).
    L_NOPE: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [8, 1], [1, 0])
    L_ROPE: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    L_SCALE: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [1, 8], [1, 0])
    LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
    S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BK // 2, 16])
    O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    ROW2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    ROW1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

    i_b = gl.program_id(0)
    i_s = gl.program_id(2)
    n_w, start, end, n_tiles = split_slots(p_len, i_b, i_s, len_x_delta, KW, KX, NSPLIT, BK)

    # The index ring: tiles 0 .. NBUF in its rows, tile NBUF + 1 in registers (stored in the loop).
    gl.static_assert(IDX_RING_ >= NBUF + 2)
    IDX_L: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    idx_flat = gl.allocate_shared_memory(gl.int32, [IDX_RING_ * BK], IDX_SMEM)
    idx_smem = idx_flat._reinterpret(gl.int32, [IDX_RING_, BK], IDX_SMEM)  # row t % IDX_RING: tile t's indices
    for i in gl.static_range(NBUF + 1):
        idx_smem.index(i).store(tile_indices(p_idx, i_b, start + i * BK, end, n_w, stride_iw, stride_ix, idx_x_delta,
                                             BK, IDX_L))
    b_idx_next = tile_indices(p_idx, i_b, start + (NBUF + 1) * BK, end, n_w, stride_iw, stride_ix, idx_x_delta, BK,
                              IDX_L)
    gl.thread_barrier()

    st_nope = gl.allocate_shared_memory(gl.uint8, [NBUF * _NOPE_TILES, BK, _TILE], ROW2)
    st_rope = gl.allocate_shared_memory(gl.bfloat16, [NBUF, BK, _ROPE], ROW2)
    st_scale = gl.allocate_shared_memory(gl.int32, [NBUF, 2 * BK], ROW1)
    for i in gl.static_range(NBUF):  # tiles past the split have no used row: their copies read nothing
        _issue_tile(st_nope, st_rope, st_scale, p_kv8, p_kv16, p_kv32, idx_smem, i, i, start, n_w, x_delta,
                    PS_W, PB_W, PS_X, PB_X, BK, L_NOPE, L_ROPE, L_SCALE)
        cp.commit_group()

    o_h = gl.arange(0, BH, layout=gl.SliceLayout(1, LOAD))
    o_dq = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
    b_q = gl.load(p_q + i_b * stride_qb + o_h[:, None] * D + o_dq[None, :])  # [BH, D]
    q_smem = gl.allocate_shared_memory(p_q.dtype.element_ty, [BH, D], SMEM, b_q)
    kv_smem = gl.allocate_shared_memory(gl.bfloat16, [BK, D], SMEM)

    b_m = gl.full([BH], -1.0e30, gl.float32, layout=gl.SliceLayout(1, S_MMA))  # [BH] running max, base 2
    b_l = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, S_MMA))  # [BH]
    b_acc = gl.zeros([BH, D], gl.float32, layout=O_MMA)  # [BH, D]
    for t in range(n_tiles):  # the split's tiles only (run-time): none past its used slots
        buf = t % NBUF
        cp.wait_group(NBUF - 1)  # tile t landed (the NBUF - 1 tiles after it may still be in flight)
        gl.thread_barrier()  # ... for every thread's copies
        _dequant_tile(kv_smem, st_nope, st_rope, st_scale, buf, L_NOPE, L_ROPE)
        fence_async_shared()  # this thread's stores, before the wgmma reads them through the async proxy
        gl.thread_barrier()  # every warp's part of the tile stored, every warp done with staging buffer buf
        # tile t - 1's ring row (every warp is past its products) takes tile t + NBUF + 1's indices
        idx_smem.index((t + NBUF + 1) % IDX_RING_).store(b_idx_next)
        b_idx_next = tile_indices(p_idx, i_b, start + (t + NBUF + 2) * BK, end, n_w, stride_iw, stride_ix,
                                  idx_x_delta, BK, IDX_L)
        if t + NBUF < n_tiles:
            _issue_tile(st_nope, st_rope, st_scale, p_kv8, p_kv16, p_kv32, idx_smem, t + NBUF, buf, start, n_w,
                        x_delta, PS_W, PB_W, PS_X, PB_X, BK, L_NOPE, L_ROPE, L_SCALE)
        cp.commit_group()  # an empty group past the split keeps wait_group's count per tile
        b_m, b_l, b_acc = _tile_products(q_smem, kv_smem, idx_smem, t % IDX_RING_, b_m, b_l, b_acc, qk_scale_log2,
                                         BH, BK)
        gl.thread_barrier()  # both warpgroups done with kv_smem (and its ring row) before the next tile
    cp.wait_group(0)

    if MERGE:  # the merge reads every split's o
        _store_partials(p_o_part, p_lse_part, b_acc, b_m, b_l, i_b, i_s, H, NSPLIT, BH, D, BK, True)
    else:
        _store_partials(p_o_part, p_lse_part, b_acc, b_m, b_l, i_b, i_s, H, NSPLIT, BH, D, BK, n_tiles > 0)
    if MERGE:
        _merge_if_last(p_o_part, p_lse_part, p_sink, p_o, p_lse, p_count, i_b, stride_ob, stride_oh, H,
                       NSPLIT, D, BH)


def gluon_fp8_sparse_decode_partials(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths,
                                     o_part, lse_part, nsplit: int, scale: float,
                                     merge: tuple | None = None) -> None:
    """Fill o_part [B, nsplit, H, D] fp32 (o over each split of the used window slots then the used
    compressed-cache slots, normalised) and lse_part [B, nsplit, H] (base 2) for q [B, 64, 512] bf16
    (rows contiguous) over the FP8 caches swa and extra (KVCache; extra may be None), indices
    [B, W] / [B, K] int32 with unit stride. The caches must pass kernel.gluon_fp8_operands_ok.

    merge = (sink [H], o [B, H, D], lse [B, H] fp32, count [B] int32 zeros): each request's last
    program also merges the partials with the sink into o and lse (kernel.py's combine, in the
    same launch) and leaves count at zero again."""
    from dsv4opt.optimizations.mma_attn.kernel import extra_offsets

    B, H, D = q.shape
    L = swa.layout
    LX = extra.layout if extra is not None else L
    _, kvu8, kv16 = swa.views()
    x_delta, idx_x_delta, len_x_delta, stride_ix, kx = extra_offsets(swa, swa_indices, swa_lengths, extra,
                                                                     extra_indices, extra_lengths)
    if merge is not None:
        sink, o, lse, count = merge
        assert nsplit > 1 and count.shape == (B,) and count.dtype == torch.int32, (nsplit, count.shape, count.dtype)
    else:
        sink, o, lse, count = lse_part, q, lse_part, swa_lengths  # not read without MERGE
    gluon_fp8_sparse_decode_kernel[(B, 1, nsplit)](
        p_q=q, p_kv8=kvu8, p_kv16=kv16, p_kv32=kvu8.view(torch.int32), p_idx=swa_indices, p_len=swa_lengths,
        p_o_part=o_part, p_lse_part=lse_part, p_sink=sink, p_o=o, p_lse=lse, p_count=count,
        stride_qb=q.stride(0), stride_iw=swa_indices.stride(0), stride_ix=stride_ix,
        stride_ob=o.stride(0), stride_oh=o.stride(1), H=H,
        qk_scale_log2=scale * LOG2E, x_delta=x_delta, idx_x_delta=idx_x_delta, len_x_delta=len_x_delta,
        KW=swa_indices.shape[1], KX=kx, NSPLIT=nsplit,
        PS_W=L.page_size, PB_W=L.page_bytes, PS_X=LX.page_size, PB_X=LX.page_bytes,
        D=D, BH=H, BK=BLOCK_K, NBUF=NUM_BUF, MERGE=merge is not None, num_warps=8,
    )
