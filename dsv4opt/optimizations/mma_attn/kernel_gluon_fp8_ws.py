"""mma-attn's FP8 main loop with warp specialisation (Gluon, Hopper): a producer gathers and
dequantises, two consumer warpgroups run the products.

Stands for SGLang's sm_120 sparse decode (`flash_mla_sparse_decode_triton`) over its FP8 KV layout,
with the structure of FlashMLA's sparse FP8 decode on Hopper: the
tensor cores do not wait for a gather or a dequantisation that other warps can do.

The single-partition FP8 loop it replaced (kernel_gluon_fp8.py, now in history) ran everything
in the same eight warps: per 64-row tile they wait for the
staged bytes, dequantise, run QK, the softmax and PV, one after another (Nsight Compute at B = 64:
one CTA per SM, 79% of cycles with no eligible warp). Here `gl.warp_specialize` splits the CTA:

- the producer partition (4 warps, 88 registers): per 16-row sub-tile, one cp.async op for the 448
  e4m3 nope bytes of every row into a [16, 512] u8 staging buffer and one for the 8-byte scale
  records; three staging buffers, two sub-tiles in flight while it dequantises a third (e4m3 times
  2^(e - 127), exact in bf16) into a ring of two [64, 512] bf16 tiles in three stores; the rope
  (bf16 already) goes by cp.async straight into the tile's last 64 columns. A tile is handed over
  with an mbarrier (`full`);
- the default partition (8 warps, two warpgroups, 208 registers; ws_blocks.consumer): q into
  shared memory once, then per tile the QK wgmma, the online softmax and the PV wgmma
  (gluon_blocks.tile_products), releasing the tile with an mbarrier (`empty`) as soon as PV has
  read it.

Few wide shared-memory operations, not many narrow ones: Triton's barrier analysis puts a bar.sync
before every store (and cp.async) into an allocation another one wrote since the last barrier,
whatever the slices; seven 64-column stores and copies a sub-tile gave 86 bar.sync and no gain
over the single-partition loop on the H200, the wide form 34 and 1.08x at B = 64.

Shared memory: q 64 KiB + two bf16 tiles 128 KiB + three 8.1 KiB staging buffers + a ring of four
tile rows of indices (1 KiB, whatever the rows' width) + the softmax's scratch; a 64-row staging
buffer would not fit beside two bf16 tiles, hence the sub-tiles. Each program runs its split of
its request's used slots (gluon_blocks.split_slots: both partitions loop over a run-time
number of tiles, so rows sized to SGLang's graph width cost per used slot); the producer keeps
the index ring filled (`_producer`). The partials are bf16, written through the ring in whole
lines; kernel.py's combine merges them. GPU and Triton 3.6 only (dispatch.py).
Measurements and what bounds it: docs/kernels/mma_attn.md.
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from dsv4opt.optimizations.mma_attn.gluon_blocks import (
    BLOCK_K, HEADS, IDX_RING_, IDX_SMEM, NOPE_TILES_, ROPE_, TILE_, split_slots, tile_indices, tile_rows,
)
from dsv4opt.optimizations.mma_attn.ws_blocks import consumer, fill_index_ring, ring_barriers, ws_buffers
from dsv4opt.tritonlib import LOG2E

SUB = 16  # rows of a producer sub-tile: 7 KiB of nope bytes, four to a 64-row tile
NUM_STAGE = 3  # staging sub-buffers: two in flight while the third is dequantised
PRODUCER_REGS = 88  # the consumers get the rest: (168 x 384 - 88 x 128) / 256 = 208; 48 spilled
# ABLATE (a diagnostic, results wrong), bits: 1 the consumers skip the products and the softmax, 2
# the producer skips its copies and dequantisation (3: both, what is left is the fixed cost); 4 the
# consumers write one head's row of the partials instead of 64, 8 they skip q's load (q is garbage):
# with 3, these split the fixed cost.
ABLATE = 0


@gluon.jit
def _issue_sub(st_data, st_scale, p_kv8, p_kv32, idx_sub, u, buf, start, n_w, x_delta,
               PS_W: gl.constexpr, PB_W: gl.constexpr, PS_X: gl.constexpr, PB_X: gl.constexpr,
               SUB_: gl.constexpr, L_D: gl.constexpr, L_SC: gl.constexpr):
    """cp.async sub-tile u's 448 nope bytes into st_data[buf] [SUB, 512] u8 (one op, 16 bytes a
    thread; columns 448-511 masked, so zero-filled and not read) and its scale words. Its indices
    are row u % (rows of idx_sub) of the index ring, seen as SUB-slot rows."""
    row, pos0 = u % idx_sub.shape[0], start + u * SUB_
    at, _, m_row = tile_rows(idx_sub, row, pos0, n_w, x_delta, gl.SliceLayout(1, L_D), PS_W, PB_W, PS_X, PB_X, SUB_)
    o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, L_D))
    cp.async_copy_global_to_shared(st_data.index(buf), p_kv8 + at[:, None] + o_c[None, :],
                                   mask=m_row[:, None] & (o_c < NOPE_TILES_ * TILE_)[None, :])
    _, at_s, m_s = tile_rows(idx_sub, row, pos0, n_w, x_delta, gl.SliceLayout(0, L_SC), PS_W, PB_W, PS_X, PB_X, SUB_)
    o_w = gl.arange(0, 2, layout=gl.SliceLayout(1, L_SC))
    ROW2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    st_words = st_scale.index(buf)._reinterpret(gl.int32, [2, SUB_], ROW2)
    cp.async_copy_global_to_shared(st_words, p_kv32 + (at_s >> 2)[None, :] + o_w[:, None], mask=m_s[None, :])


@gluon.jit
def _dequant_piece(dst, src, b_w, C0: gl.constexpr, W: gl.constexpr, J0: gl.constexpr, L: gl.constexpr):
    """Columns [C0, C0 + W) of one staged sub-tile src [SUB, 512] u8 -> dst's same columns in bf16,
    nope tile j = c // 64 scaled by byte j - J0 of b_w [SUB] (one of the rows' scale words)."""
    o_c = C0 + gl.arange(0, W, layout=gl.SliceLayout(0, L))
    shift = 8 * (o_c // TILE_ - J0)  # [W], constant per register
    b_sc = (((b_w[:, None] >> shift[None, :]) & 0xFF) << 23).to(gl.float32, bitcast=True)  # [SUB, W]
    b_raw = src.slice(C0, W, dim=1).load(L)  # [SUB, W] uint8
    b_x = b_raw.to(gl.float8e4nv, bitcast=True).to(gl.float32) * b_sc
    dst.slice(C0, W, dim=1).store(b_x.to(gl.bfloat16))


@gluon.jit
def _dequant_sub(dst, st_data, st_scale, buf, SUB_: gl.constexpr):
    """Staging buffer `buf` -> dst [SUB, 512] bf16, nope columns, in three stores (256, 128, 64)."""
    L256: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    L128: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    L64: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    src = st_data.index(buf)
    _dequant_piece(dst, src, st_scale.index(buf).slice(0, SUB_).load(gl.SliceLayout(1, L256)), 0, 256, 0, L256)
    _dequant_piece(dst, src, st_scale.index(buf).slice(SUB_, SUB_).load(gl.SliceLayout(1, L128)), 256, 128, 4, L128)
    _dequant_piece(dst, src, st_scale.index(buf).slice(SUB_, SUB_).load(gl.SliceLayout(1, L64)), 384, 64, 4, L64)


@gluon.jit
def _producer(ring, full, empty, st_data, st_scale, idx_smem, idx_sub, p_idx, p_kv8, p_kv16, p_kv32, i_b, start, end,
              n_w, n_tiles, stride_iw, stride_ix, idx_x_delta, x_delta, PS_W: gl.constexpr, PB_W: gl.constexpr,
              PS_X: gl.constexpr, PB_X: gl.constexpr, BK: gl.constexpr, SUB_: gl.constexpr, NST: gl.constexpr,
              ABLATE_: gl.constexpr):
    """Fills ring slot t % 2 with tile t once the consumers released it: the rope by cp.async
    straight into its last 64 columns, the nope columns dequantised sub-tile by sub-tile from
    staging; then `full`. Sub-tile u + NST - 1 is issued as soon as every producer thread is past
    sub-tile u - 1 (whose buffer it reuses), so NST - 1 sub-tiles are in flight during each
    dequantisation. n_tiles (run-time) tiles: the split's used slots and no more.

    The index ring (IDX_RING rows): the producer reads tiles t and t + 1 (sub-tiles issued ahead),
    the consumers tile t's row for the scores' mask. Once the consumers released tile t - 2 (the
    `empty` wait of tile t), its row takes tile t + 2's indices, read a tile earlier into
    registers; the `full` arrivals carry the rows to the consumers as they carry the tiles."""
    L_D: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [4, 1], [1, 0])  # [16, 512] u8, 16 bytes a thread
    L_SC: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [1, 4], [1, 0])  # [2, 16] i32 words
    L_R: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # [64, 64] bf16, 16 bytes a thread
    L_I: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # [BK] indices
    NSUB: gl.constexpr = BK // SUB_
    gl.static_assert(NST - 1 <= NSUB)
    gl.static_assert(IDX_RING_ >= 4)
    NU = n_tiles * NSUB
    b_idx_next = fill_index_ring(idx_smem, p_idx, i_b, start, end, n_w, stride_iw, stride_ix, idx_x_delta, 2, BK,
                                 L_I)
    gl.thread_barrier()  # rows 0 and 1 stored, before any producer thread reads them
    if ABLATE_ & 2:  # diagnostic: hand over the tiles untouched
        for t in range(n_tiles):
            mbarrier.wait(empty.index(t % 2), ((t // 2) & 1) ^ 1)
            mbarrier.arrive(full.index(t % 2))
        return
    for i in gl.static_range(NST - 1):
        if i < NU:
            _issue_sub(st_data, st_scale, p_kv8, p_kv32, idx_sub, i, i, start, n_w, x_delta, PS_W, PB_W, PS_X, PB_X,
                       SUB_, L_D, L_SC)
        cp.commit_group()
    o_r = gl.arange(0, ROPE_, layout=gl.SliceLayout(0, L_R))
    for t in range(n_tiles):
        slot = t % 2
        mbarrier.wait(empty.index(slot), ((t // 2) & 1) ^ 1)  # the first wait on each slot passes
        idx_smem.index((t + 2) % IDX_RING_).store(b_idx_next)  # tile t - 2's row: released, read by no thread
        b_idx_next = tile_indices(p_idx, i_b, start + (t + 3) * BK, end, n_w, stride_iw, stride_ix, idx_x_delta, BK,
                                  L_I)
        tile = ring.index(slot)
        at_r, _, m_r = tile_rows(idx_smem, t % IDX_RING_, start + t * BK, n_w, x_delta, gl.SliceLayout(1, L_R), PS_W,
                                 PB_W, PS_X, PB_X, BK)
        cp.async_copy_global_to_shared(tile.slice(NOPE_TILES_ * TILE_, ROPE_, dim=1),
                                       p_kv16 + ((at_r + NOPE_TILES_ * TILE_) >> 1)[:, None] + o_r[None, :],
                                       mask=m_r[:, None])
        cp.commit_group()  # the rope's group, after sub-tiles up to t * NSUB + NST - 2
        for q in gl.static_range(NSUB):
            u = t * NSUB + q
            # groups committed after sub-tile u: u + 1 .. u + NST - 2, and the rope's if u came before it
            if q < NST - 1:
                cp.wait_group(NST - 1)
            else:
                cp.wait_group(NST - 2)  # also the rope's group: complete from here on
            gl.thread_barrier()  # sub-tile u's scale words landed for every thread; all past sub-tile u - 1
            nxt = u + NST - 1
            if nxt < NU:
                _issue_sub(st_data, st_scale, p_kv8, p_kv32, idx_sub, nxt, nxt % NST, start, n_w, x_delta, PS_W, PB_W,
                           PS_X, PB_X, SUB_, L_D, L_SC)
            cp.commit_group()  # an empty group past the split keeps the counts per sub-tile
            _dequant_sub(tile.slice(q * SUB_, SUB_, dim=0), st_data, st_scale, u % NST, SUB_)
        fence_async_shared()  # this thread's stores and copies, before the consumers' wgmma reads them
        mbarrier.arrive(full.index(slot))
    cp.wait_group(0)


@gluon.jit
def gluon_fp8_ws_sparse_decode_kernel(
    p_q, p_kv8, p_kv16, p_kv32, p_idx, p_len, p_o_part, p_lse_part,
    stride_qb, stride_iw, stride_ix, H, qk_scale_log2, x_delta, idx_x_delta, len_x_delta,
    KW: gl.constexpr, KX: gl.constexpr, NSPLIT: gl.constexpr,
    PS_W: gl.constexpr, PB_W: gl.constexpr, PS_X: gl.constexpr, PB_X: gl.constexpr,
    D: gl.constexpr, BH: gl.constexpr, BK: gl.constexpr, SUB_: gl.constexpr, NST: gl.constexpr,
    PRODUCER_REGS_: gl.constexpr, ABLATE_: gl.constexpr,
):
    """One program: request i_b, all BH heads, split i_s of the request's used slots of the KW
    window slots then the KX compressed-cache slots (gluon_blocks.split_slots); writes split i_s of
    o_part [B, NSPLIT, H, D] bf16 and lse_part [B, NSPLIT, H] fp32 (base 2), which kernel.py's combine
    merges with the sink."""
    gl.static_assert(gl.num_warps() == 8)
    gl.static_assert(BK == 64)
    gl.static_assert(D == NOPE_TILES_ * TILE_ + ROPE_)
    ROW2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    ROW1: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

    i_b = gl.program_id(0)
    i_s = gl.program_id(2)
    n_w, start, end, n_tiles = split_slots(p_len, i_b, i_s, len_x_delta, KW, KX, NSPLIT, BK)
    idx_flat, idx_smem, q_smem, ring = ws_buffers(BH, BK, D)
    # row u % rows: sub-tile u's indices (tile t's row holds its sub-tiles' rows in turn)
    idx_sub = idx_flat._reinterpret(gl.int32, [idx_flat.shape[0] // SUB_, SUB_], IDX_SMEM)
    st_data = gl.allocate_shared_memory(gl.uint8, [NST, SUB_, D], ROW2)  # the nope bytes, 64 masked columns
    st_scale = gl.allocate_shared_memory(gl.int32, [NST, 2 * SUB_], ROW1)
    full, empty = ring_barriers()
    gl.thread_barrier()  # the initialised barriers, before the partitions start

    gl.warp_specialize(
        [(consumer, (q_smem, ring, full, empty, idx_smem, p_q, p_o_part, p_lse_part, i_b, i_s, n_tiles, stride_qb, H,
                     qk_scale_log2, NSPLIT, D, BH, BK, ABLATE_)),
         (_producer, (ring, full, empty, st_data, st_scale, idx_smem, idx_sub, p_idx, p_kv8, p_kv16, p_kv32, i_b, start,
                      end, n_w, n_tiles, stride_iw, stride_ix, idx_x_delta, x_delta, PS_W, PB_W, PS_X, PB_X, BK, SUB_,
                      NST, ABLATE_))],
        [4], [PRODUCER_REGS_])  # the producer: 4 warps


def gluon_fp8_ws_sparse_decode_partials(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths,
                                        o_part, lse_part, nsplit: int, scale: float) -> None:
    """One launch over the FP8 window cache then the FP8 compressed cache (at fixed offsets from it,
    operands.extra_offsets): o_part [B, nsplit, 64, 512] bf16 and lse_part [B, nsplit, 64] fp32
    (base 2) for kernel.py's combine."""
    from dsv4opt.optimizations.mma_attn.operands import extra_offsets

    B, H, D = q.shape
    assert H == HEADS, H
    L = swa.layout
    LX = extra.layout if extra is not None else L
    _, kvu8, kv16 = swa.views()
    x_delta, idx_x_delta, len_x_delta, stride_ix, kx = extra_offsets(swa, swa_indices, swa_lengths, extra,
                                                                     extra_indices, extra_lengths)
    gluon_fp8_ws_sparse_decode_kernel[(B, 1, nsplit)](
        p_q=q, p_kv8=kvu8, p_kv16=kv16, p_kv32=kvu8.view(torch.int32), p_idx=swa_indices, p_len=swa_lengths,
        p_o_part=o_part, p_lse_part=lse_part, stride_qb=q.stride(0),
        stride_iw=swa_indices.stride(0), stride_ix=stride_ix, H=H, qk_scale_log2=scale * LOG2E, x_delta=x_delta, idx_x_delta=idx_x_delta,
        len_x_delta=len_x_delta, KW=swa_indices.shape[1], KX=kx, NSPLIT=nsplit,
        PS_W=L.page_size, PB_W=L.page_bytes, PS_X=LX.page_size, PB_X=LX.page_bytes,
        D=D, BH=H, BK=BLOCK_K, SUB_=SUB, NST=NUM_STAGE, PRODUCER_REGS_=PRODUCER_REGS,
        ABLATE_=ABLATE, num_warps=8,
    )

