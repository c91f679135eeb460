"""mma-attn's main loop in Gluon (Triton's lower-level dialect) for Hopper: the schedule written out.

The block-level kernel (kernel.py) leaves the schedule to Triton's pipeliner, which issues the
gather of tile t + 1 at the end of iteration t and waits for it at once. Here the cp.async gather
of tile t + 2 goes into tile t's buffer as soon as tile t's PV product is done, so with two 64 KB
buffers one tile is in flight through a whole iteration, and the indices sit in shared memory (a
ring of tile rows refilled a few tiles ahead) so no address waits on a global load. Each program
runs its split of its request's used slots of the cache (a run-time number of tiles: rows sized to
SGLang's graph width cost per used slot). Same fp32 partials as kernel.py's main kernel;
kernel.py's combine merges them. Measured and checked in docs/kernels/mma_attn.md.

GPU only (the interpreter cannot run Gluon) and used only on the Triton versions it was validated
with (dispatch.GLUON_VALIDATED_TRITON); kernel.py falls back to the block-level kernel everywhere else.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, fence_async_shared

from dsv4opt.optimizations.mma_attn.gluon_blocks import IDX_RING_, IDX_SMEM, split_slots, tile_indices
from dsv4opt.tritonlib import LOG2E


@gluon.jit
def _issue_tile(kv_buf, p_kv, idx_smem, stride_kv, t, D: gl.constexpr, LOAD: gl.constexpr):
    """cp.async the rows of tile t (indices in row t % IDX_RING of the ring) into kv_buf; one commit group."""
    b_idx = idx_smem.index(t % IDX_RING_).load(gl.SliceLayout(1, LOAD))
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
    K: gl.constexpr, NSPLIT: gl.constexpr, SPLIT_BASE: gl.constexpr, NS_TOTAL: gl.constexpr, D: gl.constexpr,
    BH: gl.constexpr, BK: gl.constexpr,
):
    """One program: request i_b, all BH heads, split i_s of the NSPLIT splits of the request's used
    slots of one cache (`split_slots` with no compressed cache); writes split SPLIT_BASE + i_s of
    the NS_TOTAL in o_part and lse_part."""
    gl.static_assert(gl.num_warps() == 8)
    LOAD: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
    S_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BK // 2, 16])
    O_MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    P_DOT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_MMA, k_width=2)
    SMEM: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    i_b = gl.program_id(0)
    i_s = gl.program_id(2)
    _, start, end, n_tiles = split_slots(p_len, i_b, i_s, 0, K, 0, NSPLIT, BK)

    # The index ring: tiles 0-2 in its rows (-1 past the split's used slots), tile 3 in registers;
    # the gathers' addresses and the score masks never wait on a global load.
    IDX_L: gl.constexpr = gl.BlockedLayout([1], [32], [8], [0])
    idx_flat = gl.allocate_shared_memory(gl.int32, [IDX_RING_ * BK], IDX_SMEM)
    idx_smem = idx_flat._reinterpret(gl.int32, [IDX_RING_, BK], IDX_SMEM)  # row t % IDX_RING: tile t's indices
    for i in gl.static_range(3):
        idx_smem.index(i).store(tile_indices(p_idx, i_b, start + i * BK, end, K, stride_ib, 0, 0, BK, IDX_L))
    b_idx_next = tile_indices(p_idx, i_b, start + 3 * BK, end, K, stride_ib, 0, 0, BK, IDX_L)
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
    for t in range(n_tiles):  # the split's tiles only: none past its used slots
        slot = t % 2
        cp.wait_group(1)  # tile t landed (tile t + 1 may still be in flight)
        gl.thread_barrier()
        fence_async_shared()
        kv_t = kv_smem.index(slot)
        b_s = warpgroup_mma(q_smem, kv_t.permute((1, 0)), s_zero, use_acc=False)
        b_idx = idx_smem.index(t % IDX_RING_).load(gl.SliceLayout(0, S_MMA))
        b_s = gl.where((b_idx >= 0)[None, :], b_s * qk_scale_log2, float("-inf"))
        b_m_new = gl.maximum(b_m, gl.max(b_s, axis=1))
        b_alpha = gl.exp2(b_m - b_m_new)
        b_p = gl.exp2(b_s - b_m_new[:, None])
        b_l = b_l * b_alpha + gl.sum(b_p, axis=1)
        b_m = b_m_new
        b_alpha_o = gl.convert_layout(b_alpha, gl.SliceLayout(1, O_MMA))
        p_dot = gl.convert_layout(b_p.to(p_q.dtype.element_ty), P_DOT)
        b_acc = warpgroup_mma(p_dot, kv_t, b_acc * b_alpha_o[:, None])
        gl.thread_barrier()  # both warpgroups are done with this buffer and with tile t - 1's ring row
        idx_smem.index((t + 3) % IDX_RING_).store(b_idx_next)
        b_idx_next = tile_indices(p_idx, i_b, start + (t + 4) * BK, end, K, stride_ib, 0, 0, BK, IDX_L)
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


def gluon_sparse_decode_partials(q, kv, indices, lengths, o_part, lse_part, nsplit: int,
                                 scale: float, split_base: int = 0, ns_total: int | None = None) -> None:
    """Fill splits [split_base, split_base + nsplit) of o_part [B, ns_total, H, D] (o over each
    split of the used slots, normalised) and lse_part [B, ns_total, H] (base 2) for q [B, 64, D] (rows contiguous) over
    kv [N, D] (contiguous rows)."""
    B, H, D = q.shape
    gluon_sparse_decode_kernel[(B, 1, nsplit)](
        p_q=q, p_kv=kv, p_idx=indices, p_len=lengths, p_o_part=o_part, p_lse_part=lse_part,
        stride_qb=q.stride(0), stride_kv=kv.stride(0), stride_ib=indices.stride(0), H=H,
        qk_scale_log2=scale * LOG2E, K=indices.shape[1], NSPLIT=nsplit, SPLIT_BASE=split_base,
        NS_TOTAL=ns_total or nsplit, D=D, BH=H, BK=BLOCK_K, num_warps=8,
    )
