"""mma-attn's main loop in Gluon (Triton's lower-level dialect) for Hopper: the schedule written out.

The block-level kernel (kernel.py) leaves the schedule to Triton's pipeliner, which issues the
gather of tile t + 1 at the end of iteration t and waits for it at once. Here the cp.async gather
of tile t + 2 goes into tile t's buffer as soon as tile t's PV product is done, so with two 64 KB
buffers one tile is in flight through a whole iteration, and the chunk's indices sit in shared
memory so no address waits on a global load. Same fp32 partials as kernel.py's main kernel (same
chunks); kernel.py's combine merges them. Measured and checked in docs/kernels/mma_attn.md.

GPU only (the interpreter cannot run Gluon) and used only on the Triton versions it was validated
with (kernel.GLUON_VALIDATED_TRITON); kernel.py falls back to the block-level kernel everywhere else.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, fence_async_shared

from dsv4opt.tritonlib import LOG2E


@gluon.jit
def _issue_tile(kv_buf, p_kv, idx_smem, stride_kv, t, D: gl.constexpr, LOAD: gl.constexpr):
    """cp.async the rows of tile t (indices from shared memory) into kv_buf; one commit group."""
    b_idx = idx_smem.index(t).load(gl.SliceLayout(1, LOAD))
    m_row = b_idx >= 0
    row = gl.where(m_row, b_idx, 0).to(gl.int64)
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
    ptrs = p_kv + row[:, None] * stride_kv + o_d[None, :]
    cp.async_copy_global_to_shared(kv_buf, ptrs, mask=m_row[:, None] & (o_d[None, :] < D))
    cp.commit_group()


@gluon.jit
def gluon_sparse_decode_kernel(
    p_q, p_kv, p_idx, p_len, p_o_part, p_lse_part,
    stride_qb, stride_kv, stride_ib, H, qk_scale_log2,
    K: gl.constexpr, CHUNK: gl.constexpr, SPLIT_BASE: gl.constexpr, NS_TOTAL: gl.constexpr, D: gl.constexpr,
    BH: gl.constexpr, BK: gl.constexpr,
):
    gl.static_assert(gl.num_warps() == 8)
    LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
    S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BK // 2, 16])
    O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    P_DOT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_MMA, k_width=2)
    SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    i_b = gl.program_id(0)
    i_s = gl.program_id(2)
    n_used = gl.load(p_len + i_b)
    start = i_s * CHUNK
    end = gl.minimum(start + CHUNK, gl.minimum(n_used, K))
    p_idx_b = p_idx + i_b * stride_ib

    # Every index of the chunk, once, into shared memory (-1 past the chunk's used slots): the
    # gathers' addresses and the score masks then never wait on a global load.
    N_TILES: gl.constexpr = CHUNK // BK
    IDX_ROWS: gl.constexpr = triton.next_power_of_2(N_TILES + 2)  # two tiles of run-out past the end
    IDX_L: gl.constexpr = gl.BlockedLayout([1], [32], [8], [0])
    IDX_S: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    o_k = start + gl.arange(0, IDX_ROWS * BK, layout=IDX_L)
    b_idx_all = gl.load(p_idx_b + o_k, mask=o_k < end, other=-1)
    idx_flat = gl.allocate_shared_memory(gl.int32, [IDX_ROWS * BK], IDX_S, b_idx_all)
    idx_smem = idx_flat._reinterpret(gl.int32, [IDX_ROWS, BK], IDX_S)  # row t: tile t's indices
    gl.thread_barrier()
    kv_smem = gl.allocate_shared_memory(p_kv.dtype.element_ty, [2, BK, D], SMEM)
    _issue_tile(kv_smem.index(0), p_kv, idx_smem, stride_kv, 0, D, LOAD)
    _issue_tile(kv_smem.index(1), p_kv, idx_smem, stride_kv, 1, D, LOAD)

    o_h = gl.arange(0, BH, layout=gl.SliceLayout(1, LOAD))
    o_dq = gl.arange(0, D, layout=gl.SliceLayout(0, LOAD))
    b_q = gl.load(p_q + i_b * stride_qb + o_h[:, None] * D + o_dq[None, :])
    q_smem = gl.allocate_shared_memory(p_q.dtype.element_ty, [BH, D], SMEM, b_q)

    b_m = gl.full([BH], -1.0e30, gl.float32, layout=gl.SliceLayout(1, S_MMA))
    b_l = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, S_MMA))
    b_acc = gl.zeros([BH, D], gl.float32, layout=O_MMA)
    s_zero = gl.zeros([BH, BK], gl.float32, layout=S_MMA)
    for t in range(N_TILES):
        slot = t % 2
        cp.wait_group(1)  # tile t landed (tile t + 1 may still be in flight)
        gl.thread_barrier()
        fence_async_shared()
        kv_t = kv_smem.index(slot)
        b_s = warpgroup_mma(q_smem, kv_t.permute((1, 0)), s_zero, use_acc=False)
        b_idx = idx_smem.index(t).load(gl.SliceLayout(0, S_MMA))
        b_s = gl.where((b_idx >= 0)[None, :], b_s * qk_scale_log2, float("-inf"))
        b_m_new = gl.maximum(b_m, gl.max(b_s, axis=1))
        b_alpha = gl.exp2(b_m - b_m_new)
        b_p = gl.exp2(b_s - b_m_new[:, None])
        b_l = b_l * b_alpha + gl.sum(b_p, axis=1)
        b_m = b_m_new
        b_alpha_o = gl.convert_layout(b_alpha, gl.SliceLayout(1, O_MMA))
        p_dot = gl.convert_layout(b_p.to(p_q.dtype.element_ty), P_DOT)
        b_acc = warpgroup_mma(p_dot, kv_t, b_acc * b_alpha_o[:, None])
        gl.thread_barrier()  # both warpgroups are done with this buffer
        _issue_tile(kv_t, p_kv, idx_smem, stride_kv, t + 2, D, LOAD)
    cp.wait_group(0)

    m_any = b_l > 0
    b_lse2 = gl.where(m_any, b_m + gl.log2(gl.where(m_any, b_l, 1.0)), float("-inf"))
    inv = gl.convert_layout(1.0 / gl.where(m_any, b_l, 1.0), gl.SliceLayout(1, O_MMA))
    b_o = b_acc * inv[:, None]
    o_ho = gl.arange(0, BH, layout=gl.SliceLayout(1, O_MMA))
    o_do = gl.arange(0, D, layout=gl.SliceLayout(0, O_MMA))
    row_part = (i_b * NS_TOTAL + SPLIT_BASE + i_s).to(gl.int64) * H + o_ho
    gl.store(p_o_part + row_part[:, None] * D + o_do[None, :], b_o)
    o_hs = gl.arange(0, BH, layout=gl.SliceLayout(1, S_MMA))
    gl.store(p_lse_part + (i_b * NS_TOTAL + SPLIT_BASE + i_s).to(gl.int64) * H + o_hs, b_lse2)


HEADS = 64  # one warpgroup's MMA rows
BLOCK_K = 64


def gluon_sparse_decode_partials(q, kv, indices, lengths, o_part, lse_part, chunk: int, nsplit: int,
                                 scale: float, split_base: int = 0, ns_total: int | None = None) -> None:
    """Fill splits [split_base, split_base + nsplit) of o_part [B, ns_total, H, D] (o over each chunk,
    normalised) and lse_part [B, ns_total, H] (base 2) for q [B, 64, D] (rows contiguous) over
    kv [N, D] (contiguous rows)."""
    B, H, D = q.shape
    gluon_sparse_decode_kernel[(B, 1, nsplit)](
        p_q=q, p_kv=kv, p_idx=indices, p_len=lengths, p_o_part=o_part, p_lse_part=lse_part,
        stride_qb=q.stride(0), stride_kv=kv.stride(0), stride_ib=indices.stride(0), H=H,
        qk_scale_log2=scale * LOG2E, K=indices.shape[1], CHUNK=chunk, SPLIT_BASE=split_base,
        NS_TOTAL=ns_total or nsplit, D=D, BH=H, BK=BLOCK_K, num_warps=8,
    )
