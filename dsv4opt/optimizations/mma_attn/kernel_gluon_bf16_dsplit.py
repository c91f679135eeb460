"""mma-attn's bf16-KV loop with QK split over D between its two consumer warpgroups (Gluon, Hopper).

An experiment, off (kernel.GLUON_BF16_WS_DSPLIT): compiled for sm_90a, never run on a GPU yet.

kernel_gluon_bf16_ws.py's consumers split every tile between their two warpgroups twice:
- QK by slots: each warpgroup reads all of q for its 32 of the 64 slots;
- PV by value columns: the softmax's row statistics cross warpgroups through shared memory, and
  P changes layout through shared memory.

Here each consumer warpgroup is a partition of its own and owns half of D throughout:
- QK over its half of q and of the tile gives a [64, 64] partial score;
- the two partials are swapped through shared memory (two 16 KiB buffers, mbarriers both ways);
- both warpgroups then hold the whole score and run the same softmax, with no cross-warpgroup
  statistics;
- P goes from registers into PV over the warpgroup's half of the value columns.

So q is read once a tile instead of twice, for 32 KiB of shared memory. That fits beside the bf16
loop's 198 KiB, not beside the FP8 loop's 222. Same producer, ring, chunks and partials as
kernel_gluon_bf16_ws.py; the ring's `empty` barriers count both consumers. docs/kernels/mma_attn.md
says what it must beat.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma

from dsv4opt.optimizations.mma_attn.kernel_gluon_bf16_ws import _producer
from dsv4opt.optimizations.mma_attn.kernel_gluon_fp8 import _online_softmax
from dsv4opt.optimizations.mma_attn.kernel_gluon_fp8_ws import _ws_buffers

# 12 warps share the register file: 168 registers a thread at launch. The producer keeps
# kernel_gluon_fp8_ws.PRODUCER_REGS, and the two consumer halves split the rest evenly: the default
# partition (half 0) gets what the workers leave, so half 1 must ask for exactly half.
LAUNCH_REGS = 65536 // (12 * 32) // 8 * 8


def consumer_regs(producer_regs: int) -> int:
    """Half 1's register budget for a producer budget: 208 for the committed 88."""
    return (3 * LAUNCH_REGS - producer_regs) // 2 // 8 * 8


@gluon.jit
def _half(q_smem, ring, full, empty, xch, xready, xfree, idx_smem, p_q, p_o_part, p_lse_part, i_b, i_s, stride_qb,
          H, qk_scale_log2, HALF: gl.constexpr, N_TILES: gl.constexpr, NSPLIT: gl.constexpr, D: gl.constexpr,
          BH: gl.constexpr, BK: gl.constexpr, STAGED: gl.constexpr):
    """One consumer warpgroup, value columns [HALF * D / 2, +D / 2): its half of q into shared
    memory, then per tile its partial QK, the swap, the softmax of the whole score and its half of
    PV; writes its half of split i_s's o (and, HALF 0, the lse)."""
    DH: gl.constexpr = D // 2
    LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BK, 16])
    O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DH, 16])
    P_DOT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_MMA, k_width=2)
    q_half = q_smem.slice(HALF * DH, DH, dim=1)
    o_h = gl.arange(0, BH, layout=gl.SliceLayout(1, LOAD))
    o_dq = gl.arange(0, DH, layout=gl.SliceLayout(0, LOAD))
    q_half.store(gl.load(p_q + i_b * stride_qb + o_h[:, None] * D + HALF * DH + o_dq[None, :]))
    fence_async_shared()
    gl.thread_barrier()  # this warpgroup's half of q, before its wgmma reads it

    mine = xch.index(HALF)
    theirs = xch.index(1 - HALF)
    s_zero = gl.zeros([BH, BK], gl.float32, layout=S_MMA)
    b_m = gl.full([BH], -1.0e30, gl.float32, layout=gl.SliceLayout(1, S_MMA))  # [BH] running max, base 2
    b_l = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, S_MMA))  # [BH]
    b_acc = gl.zeros([BH, DH], gl.float32, layout=O_MMA)  # [BH, DH]
    for t in range(N_TILES):
        slot = t % 2
        mbarrier.wait(full.index(slot), (t // 2) & 1)
        kv_half = ring.index(slot).slice(HALF * DH, DH, dim=1)  # [BK, DH]
        b_s = warpgroup_mma(q_half, kv_half.permute((1, 0)), s_zero, use_acc=False)  # [BH, BK], half of D
        mbarrier.wait(xfree.index(HALF), (t & 1) ^ 1)  # the other read my last partial (the first wait passes)
        mine.store(b_s)
        mbarrier.arrive(xready.index(HALF))  # a partition-wide bar.sync first: every row stored
        mbarrier.wait(xready.index(1 - HALF), t & 1)
        b_s = b_s + theirs.load(S_MMA)
        mbarrier.arrive(xfree.index(1 - HALF))
        b_m, b_l, b_alpha, b_p = _online_softmax(b_s, idx_smem, t, b_m, b_l, qk_scale_log2)  # the whole score
        b_alpha_o = gl.convert_layout(b_alpha, gl.SliceLayout(1, O_MMA))
        p_dot = gl.convert_layout(b_p.to(gl.bfloat16), P_DOT)
        b_acc = warpgroup_mma(p_dot, kv_half, b_acc * b_alpha_o[:, None])  # waits for its completion
        mbarrier.arrive(empty.index(slot))

    m_any = b_l > 0
    if HALF == 0:  # both halves hold the same statistics
        b_lse2 = gl.where(m_any, b_m + gl.log2(gl.where(m_any, b_l, 1.0)), float("-inf"))  # [BH]
        o_hs = gl.arange(0, BH, layout=gl.SliceLayout(1, S_MMA))
        gl.store(p_lse_part + (i_b * NSPLIT + i_s).to(gl.int64) * H + o_hs, b_lse2)
    inv = gl.convert_layout(1.0 / gl.where(m_any, b_l, 1.0), gl.SliceLayout(1, O_MMA))
    b_o = b_acc * inv[:, None]  # [BH, DH]
    row_part = (i_b * NSPLIT + i_s).to(gl.int64) * H
    if STAGED:
        # through the ring, once both warpgroups released the last tile (so neither reads it any
        # more; the producer is done), each into its own half of the columns
        dt: gl.constexpr = p_o_part.dtype.element_ty
        VEC: gl.constexpr = 128 // dt.primitive_bitwidth  # 16 bytes
        STAGE: gl.constexpr = gl.SwizzledSharedLayout(vec=VEC, per_phase=1, max_phase=8, order=[1, 0])
        OUT: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [4, 1], [1, 0])
        gl.static_assert(BH * D * (dt.primitive_bitwidth // 8) <= 2 * BK * D * 2)  # fits the ring
        mbarrier.wait(empty.index((N_TILES - 1) % 2), ((N_TILES - 1) // 2) & 1)
        stage = ring._reinterpret(dt, [BH, D], STAGE).slice(HALF * DH, DH, dim=1)
        stage.store(b_o.to(dt))
        gl.thread_barrier()  # this warpgroup's rows staged, before its warps read rows another wrote
        o_ho = gl.arange(0, BH, layout=gl.SliceLayout(1, OUT))
        o_do = gl.arange(0, DH, layout=gl.SliceLayout(0, OUT))
        gl.store(p_o_part + (row_part + o_ho)[:, None] * D + HALF * DH + o_do[None, :], stage.load(OUT))
    else:
        o_ho = gl.arange(0, BH, layout=gl.SliceLayout(1, O_MMA))
        o_do = gl.arange(0, DH, layout=gl.SliceLayout(0, O_MMA))
        gl.store(p_o_part + (row_part + o_ho)[:, None] * D + HALF * DH + o_do[None, :], b_o)


@gluon.jit
def gluon_bf16_dsplit_sparse_decode_kernel(
    p_q, p_kv, p_idx, p_len, p_o_part, p_lse_part,
    stride_qb, stride_kv, stride_iw, stride_ix, H, qk_scale_log2, x_delta, idx_x_delta, len_x_delta,
    KW: gl.constexpr, KX: gl.constexpr, CHUNK: gl.constexpr, NSPLIT: gl.constexpr,
    D: gl.constexpr, BH: gl.constexpr, BK: gl.constexpr, CONSUMER_REGS_: gl.constexpr,
    PRODUCER_REGS_: gl.constexpr, STAGED: gl.constexpr, ABLATE_: gl.constexpr,
):
    """kernel_gluon_bf16_ws.gluon_bf16_ws_sparse_decode_kernel's contract, with 4 warps a
    partition: the default one and the first worker are the two consumer halves, the second worker
    the producer."""
    gl.static_assert(gl.num_warps() == 4)
    gl.static_assert(BK == 64)
    # 744 B of shared memory are left at 5 tiles a chunk: 8 tiles or more would double the index
    # rows (_ws_buffers) past the 227 KiB
    gl.static_assert(CHUNK // BK + 1 <= 8)
    XCH: gl.constexpr = gl.SwizzledSharedLayout(vec=2, per_phase=1, max_phase=8, order=[1, 0])
    i_b = gl.program_id(0)
    i_s = gl.program_id(2)
    start = i_s * CHUNK
    N_TILES: gl.constexpr = CHUNK // BK
    _, idx_smem, q_smem, ring = _ws_buffers(p_idx, p_len, i_b, start, stride_iw, stride_ix, idx_x_delta, len_x_delta,
                                            KW, KX, CHUNK, BH, BK, D)
    xch = gl.allocate_shared_memory(gl.float32, [2, BH, BK], XCH)  # each half's partial score
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    xready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    xfree = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        # Gluon's arrive: a partition-wide bar.sync, then one thread's arrive
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both consumer halves release a tile
        mbarrier.init(xready.index(i), count=1)
        mbarrier.init(xfree.index(i), count=1)
    gl.thread_barrier()  # the indices and the initialised barriers, before the partitions start

    gl.warp_specialize(
        [(_half, (q_smem, ring, full, empty, xch, xready, xfree, idx_smem, p_q, p_o_part, p_lse_part, i_b, i_s,
                  stride_qb, H, qk_scale_log2, gl.constexpr(0), N_TILES, NSPLIT, D, BH, BK, STAGED)),
         (_half, (q_smem, ring, full, empty, xch, xready, xfree, idx_smem, p_q, p_o_part, p_lse_part, i_b, i_s,
                  stride_qb, H, qk_scale_log2, gl.constexpr(1), N_TILES, NSPLIT, D, BH, BK, STAGED)),
         (_producer, (ring, full, empty, idx_smem, p_kv, start, x_delta, stride_kv, N_TILES, KW, BK, D, ABLATE_))],
        [4, 4], [CONSUMER_REGS_, PRODUCER_REGS_])
