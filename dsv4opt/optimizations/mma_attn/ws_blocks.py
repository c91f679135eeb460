"""What mma-attn's two warp-specialised loops (kernel_gluon_fp8_ws.py, kernel_gluon_bf16_ws.py)
share: the shared memory they allocate first (`ws_buffers`), the ring's hand-over barriers
(`ring_barriers`), the index ring's first rows (`fill_index_ring`) and the whole consumer partition
(`consumer`: q once, QK, the online softmax and PV per tile, the partials through the ring). Only
their producers differ. GPU only (the interpreter cannot run Gluon), Triton 3.6 only
(dispatch.GLUON_VALIDATED_TRITON).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from dsv4opt.optimizations.mma_attn.gluon_blocks import IDX_RING_, IDX_SMEM, split_result, tile_indices, tile_products


@gluon.jit
def fill_index_ring(idx_smem, p_idx, i_b, start, end, n_w, stride_iw, stride_ix, idx_x_delta, ROWS: gl.constexpr,
                    BK: gl.constexpr, L: gl.constexpr):
    """Rows 0 .. ROWS - 1 of the index ring get tiles 0 .. ROWS - 1's indices; returns tile ROWS's,
    read into registers (layout L) for the producer to store a tile later."""
    for i in gl.static_range(ROWS):
        idx_smem.index(i).store(tile_indices(p_idx, i_b, start + i * BK, end, n_w, stride_iw, stride_ix, idx_x_delta,
                                             BK, L))
    return tile_indices(p_idx, i_b, start + ROWS * BK, end, n_w, stride_iw, stride_ix, idx_x_delta, BK, L)


@gluon.jit
def consumer(q_smem, ring, full, empty, idx_smem, p_q, p_o_part, p_lse_part, i_b, i_s, n_tiles, stride_qb, H,
             qk_scale_log2, NSPLIT: gl.constexpr, D: gl.constexpr, BH: gl.constexpr, BK: gl.constexpr,
             ABLATE_: gl.constexpr):
    """q into shared memory (not for a split with no tile), then per ring tile (n_tiles, run-time)
    QK, the online softmax (base 2, masked slots at -inf; tile t's indices in row t % IDX_RING of
    idx_smem, which the producer filled before handing the tile over) and PV as in
    gluon_blocks.tile_products; writes split i_s's partials (lse -inf and o unwritten for a split with no
    tile) in o_part's dtype (bf16) through the ring, in whole lines (`_store_partials_staged`). Shared
    by the FP8 and bf16 warp-specialised loops: only their producers differ."""
    LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
    S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BK // 2, 16])
    O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    o_h = gl.arange(0, BH, layout=gl.SliceLayout(1, LOAD))
    o_dq = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
    if not (ABLATE_ & 8):
        if n_tiles > 0:  # an idle split reads no q
            q_smem.store(gl.load(p_q + i_b * stride_qb + o_h[:, None] * D + o_dq[None, :]))
    fence_async_shared()
    gl.thread_barrier()  # every consumer warp's part of q, before either warpgroup's wgmma reads it

    b_m = gl.full([BH], -1.0e30, gl.float32, layout=gl.SliceLayout(1, S_MMA))  # [BH] running max, base 2
    b_l = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, S_MMA))  # [BH]
    b_acc = gl.zeros([BH, D], gl.float32, layout=O_MMA)  # [BH, D]
    for t in range(n_tiles):
        slot = t % 2
        mbarrier.wait(full.index(slot), (t // 2) & 1)
        kv_t = ring.index(slot)
        if ABLATE_ & 1:  # diagnostic: release the tile unread
            mbarrier.arrive(empty.index(slot))
        else:
            b_m, b_l, b_acc = tile_products(q_smem, kv_t, idx_smem, t % IDX_RING_, b_m, b_l, b_acc, qk_scale_log2,
                                            BH, BK)
            mbarrier.arrive(empty.index(slot))

    if ABLATE_ & 4:  # diagnostic: one head's row (the products stay live, 1/64 of the bytes)
        o_ho = gl.arange(0, BH, layout=gl.SliceLayout(1, O_MMA))
        o_do = gl.arange(0, D, layout=gl.SliceLayout(0, O_MMA))
        row_part = (i_b * NSPLIT + i_s).to(gl.int64) * H + o_ho
        gl.store(p_o_part + row_part[:, None] * D + o_do[None, :], b_acc, mask=(o_ho == 0)[:, None])
    else:  # an idle split's o is left unwritten: its lse is -inf and kernel.py's combine skips it
        _store_partials_staged(ring, p_o_part, p_lse_part, b_acc, b_m, b_l, i_b, i_s, H, NSPLIT, BH, D, BK,
                               n_tiles > 0)


@gluon.jit
def _store_partials_staged(ring, p_o_part, p_lse_part, b_acc, b_m, b_l, i_b, i_s, H, NSPLIT: gl.constexpr,
                           BH: gl.constexpr, D: gl.constexpr, BK: gl.constexpr, store_o):
    """A split's partials through shared memory: o (normalised, in o_part's dtype)
    into the ring, free once both warpgroups' last PV is done, then out 16 bytes a thread, a warp
    writing 512 contiguous bytes of one row. Stored straight from the accumulator's layout, a warp
    instruction writes 32 bytes (fp32) or 16 (bf16) of each of eight rows. The lse always; o only
    where `store_o` (the same in every thread)."""
    dt: gl.constexpr = p_o_part.dtype.element_ty
    VEC: gl.constexpr = 128 // dt.primitive_bitwidth  # 16 bytes
    # 16-byte units XOR-swizzled by row: the accumulator's eight rows a warp instruction land on
    # eight different units of a 128-byte line, not on the same banks (rows are 1-2 KB apart)
    STAGE: gl.constexpr = gl.SwizzledSharedLayout(vec=VEC, per_phase=1, max_phase=8, order=[1, 0])
    OUT: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [gl.num_warps(), 1], [1, 0])
    gl.static_assert(BH * D * (dt.primitive_bitwidth // 8) <= 2 * BK * D * 2)  # fits the ring
    b_o = split_result(p_lse_part, b_acc, b_m, b_l, i_b, i_s, H, NSPLIT, BH, BK)  # [BH, D] fp32
    if store_o:
        stage = ring._reinterpret(dt, [BH, D], STAGE)
        gl.thread_barrier()  # both warpgroups' last PV has read the ring
        stage.store(b_o.to(dt))
        gl.thread_barrier()  # every row staged, before any warp reads rows another wrote
        o_h = gl.arange(0, BH, layout=gl.SliceLayout(1, OUT))
        o_d = gl.arange(0, D, layout=gl.SliceLayout(0, OUT))
        row_part = (i_b * NSPLIT + i_s).to(gl.int64) * H + o_h
        gl.store(p_o_part + row_part[:, None] * D + o_d[None, :], stage.load(OUT))


@gluon.jit
def ws_buffers(BH: gl.constexpr, BK: gl.constexpr, D: gl.constexpr):
    """What both warp-specialised loops allocate first: the index ring (flat, and row r: the tile
    rows its producer fills), q's buffer and the ring of two bf16 tiles."""
    SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    idx_flat = gl.allocate_shared_memory(gl.int32, [IDX_RING_ * BK], IDX_SMEM)
    idx_smem = idx_flat._reinterpret(gl.int32, [IDX_RING_, BK], IDX_SMEM)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BH, D], SMEM)
    ring = gl.allocate_shared_memory(gl.bfloat16, [2, BK, D], SMEM)
    return idx_flat, idx_smem, q_smem, ring


@gluon.jit
def ring_barriers():
    """The ring's hand-over barriers, `full` (producer -> consumers) and `empty` (back), one a slot,
    each counting one arrival: Gluon's arrive is a partition-wide bar.sync, then one thread's arrive."""
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return full, empty
