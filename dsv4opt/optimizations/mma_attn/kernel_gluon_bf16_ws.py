"""mma-attn's bf16-KV main loop with warp specialisation (Gluon, Hopper), one launch over both caches.

Stands for SGLang's sm_120 sparse decode (`flash_mla_sparse_decode_triton`) on bf16 latent rows,
as kernel_gluon.py does, but as kernel_gluon_fp8_ws.py runs the FP8 layout: one launch covers the
window slots followed by the compressed-cache slots (the compressed cache's rows, indices and
lengths at fixed offsets from the window cache's, as kernel.py's main kernel reads them), where
kernel_gluon.py runs once per cache; and `gl.warp_specialize` splits the CTA:

- the producer partition (4 warps): the rows of tile t + 1 gathered by cp.async (16 bytes a
  thread, masked rows zero-filled) straight into ring slot (t + 1) % 2 as soon as the consumers
  released it; the slot handed over with an mbarrier (`full`) once the copies landed. bf16 rows
  need no dequantisation, so no staging: one 64 KiB tile in flight while the consumers multiply
  the other;
- the default partition (8 warps): ws_blocks.consumer, the FP8 loop's own (q once, QK, the
  online softmax and PV per tile; the partials).

Shared memory: q 64 KiB + two bf16 tiles 128 KiB + the ring of four tile rows of indices + the
softmax's scratch. Each program runs its split of its request's used slots (a run-time number of
tiles: rows sized to SGLang's graph width cost per used slot), the producer keeping the index ring
filled as kernel_gluon_fp8_ws's does. Same splits and bf16 partials as the FP8 loop (kernel.py's
combine merges them), and the same producer register budget and ABLATE diagnostic
(kernel_gluon_fp8_ws.PRODUCER_REGS, .ABLATE); GPU and Triton 3.6 only (dispatch.py). Measurements:
docs/kernels/mma_attn.md.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from dsv4opt.optimizations.mma_attn.gluon_blocks import BLOCK_K, HEADS, IDX_RING_, split_slots, tile_indices
from dsv4opt.optimizations.mma_attn.ws_blocks import consumer, fill_index_ring, ring_barriers, ws_buffers
from dsv4opt.tritonlib import LOG2E


@gluon.jit
def _issue_rows(dst, p_kv, idx_smem, t, start, n_w, x_delta, stride_kv, BK: gl.constexpr, D: gl.constexpr,
                L: gl.constexpr):
    """cp.async tile t's rows (indices in row t % IDX_RING of the ring) into dst [BK, D] bf16: used
    slots from n_w on are the compressed cache's, whose rows start x_delta elements past the window
    cache's; unused rows (index -1) read nothing and are zero-filled, so their masked scores
    multiply finite values."""
    b_idx = idx_smem.index(t % IDX_RING_).load(gl.SliceLayout(1, L))  # [BK]
    m_row = b_idx >= 0
    tok = gl.where(m_row, b_idx, 0).to(gl.int64)  # caches can exceed 2^31 elements
    in_x = (start + t * BK + gl.arange(0, BK, layout=gl.SliceLayout(1, L))) >= n_w
    at = gl.where(in_x, x_delta, 0) + tok * stride_kv
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, L))
    cp.async_copy_global_to_shared(dst, p_kv + at[:, None] + o_d[None, :], mask=m_row[:, None])


@gluon.jit
def _producer(ring, full, empty, idx_smem, p_idx, p_kv, i_b, start, end, n_w, n_tiles, stride_iw, stride_ix,
              idx_x_delta, x_delta, stride_kv, BK: gl.constexpr, D: gl.constexpr, ABLATE_: gl.constexpr):
    """Tile 0 into slot 0; then per tile t (n_tiles, run-time): wait for its copies, hand it over
    (`full`), wait until the consumers released slot (t + 1) % 2 (tile t - 1's) and issue tile
    t + 1 into it. The index ring: tiles 0-2 first; once tile t - 1 is released its row takes tile
    t + 3's indices, read a tile earlier into registers (the consumers read tile t's row)."""
    L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])  # 16 bytes a thread
    L_I: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # [BK] indices
    gl.static_assert(IDX_RING_ >= 4)
    b_idx_next = fill_index_ring(idx_smem, p_idx, i_b, start, end, n_w, stride_iw, stride_ix, idx_x_delta, 3, BK,
                                 L_I)
    gl.thread_barrier()  # rows 0-2 stored, before any producer thread reads them
    if ABLATE_ & 2:  # diagnostic (kernel_gluon_fp8_ws.ABLATE): hand over the tiles untouched
        for t in range(n_tiles):
            mbarrier.wait(empty.index(t % 2), ((t // 2) & 1) ^ 1)
            mbarrier.arrive(full.index(t % 2))
        return
    _issue_rows(ring.index(0), p_kv, idx_smem, 0, start, n_w, x_delta, stride_kv, BK, D, L)
    cp.commit_group()
    for t in range(n_tiles):
        cp.wait_group(0)  # this thread's copies of tile t landed (the only group in flight)
        fence_async_shared()  # ... before the consumers' wgmma reads them through the async proxy
        mbarrier.arrive(full.index(t % 2))  # a partition-wide bar.sync first: every thread's copies
        if t + 1 < n_tiles:
            nxt = (t + 1) % 2
            mbarrier.wait(empty.index(nxt), (((t + 1) // 2) & 1) ^ 1)  # the first wait on slot 1 passes
            idx_smem.index((t + 3) % IDX_RING_).store(b_idx_next)  # tile t - 1's row: released
            b_idx_next = tile_indices(p_idx, i_b, start + (t + 4) * BK, end, n_w, stride_iw, stride_ix, idx_x_delta,
                                      BK, L_I)
            _issue_rows(ring.index(nxt), p_kv, idx_smem, t + 1, start, n_w, x_delta, stride_kv, BK, D, L)
            cp.commit_group()


@gluon.jit
def gluon_bf16_ws_sparse_decode_kernel(
    p_q, p_kv, p_idx, p_len, p_o_part, p_lse_part,
    stride_qb, stride_kv, stride_iw, stride_ix, H, qk_scale_log2, x_delta, idx_x_delta,
    len_x_delta, KW: gl.constexpr, KX: gl.constexpr, NSPLIT: gl.constexpr,
    D: gl.constexpr, BH: gl.constexpr, BK: gl.constexpr, PRODUCER_REGS_: gl.constexpr, ABLATE_: gl.constexpr,
):
    """One program: request i_b, all BH heads, split i_s of the request's used slots of the KW
    window slots then the KX compressed-cache slots (gluon_blocks.split_slots) over bf16 rows [N, D]; writes split i_s of o_part
    [B, NSPLIT, H, D] bf16 and lse_part [B, NSPLIT, H] fp32 (base 2)."""
    gl.static_assert(gl.num_warps() == 8)
    gl.static_assert(BK == 64)
    i_b = gl.program_id(0)
    i_s = gl.program_id(2)
    n_w, start, end, n_tiles = split_slots(p_len, i_b, i_s, len_x_delta, KW, KX, NSPLIT, BK)
    _, idx_smem, q_smem, ring = ws_buffers(BH, BK, D)
    full, empty = ring_barriers()
    gl.thread_barrier()  # the initialised barriers, before the partitions start

    gl.warp_specialize(
        [(consumer, (q_smem, ring, full, empty, idx_smem, p_q, p_o_part, p_lse_part, i_b, i_s, n_tiles, stride_qb, H,
                     qk_scale_log2, NSPLIT, D, BH, BK, ABLATE_)),
         (_producer, (ring, full, empty, idx_smem, p_idx, p_kv, i_b, start, end, n_w, n_tiles, stride_iw, stride_ix,
                      idx_x_delta, x_delta, stride_kv, BK, D, ABLATE_))],
        [4], [PRODUCER_REGS_])


def gluon_bf16_ws_sparse_decode_partials(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths,
                                         o_part, lse_part, nsplit: int, scale: float) -> None:
    """Fill o_part [B, nsplit, H, D] (bf16; o over each split of the used window slots then
    the used compressed-cache slots, normalised) and lse_part [B, nsplit, H] (base 2) for q [B, 64, 512]
    bf16 (rows contiguous) over the bf16 caches swa and extra (KVCache; extra may be None) with
    indices [B, W] / [B, K] int32 of unit stride. The caches must pass dispatch.gluon_bf16_ws_operands_ok."""
    from dsv4opt.optimizations.mma_attn import kernel_gluon_fp8_ws as ws
    from dsv4opt.optimizations.mma_attn.operands import extra_offsets

    B, H, D = q.shape
    assert H == HEADS, H
    kv = swa.data
    x_delta, idx_x_delta, len_x_delta, stride_ix, kx = extra_offsets(swa, swa_indices, swa_lengths, extra,
                                                                     extra_indices, extra_lengths)
    gluon_bf16_ws_sparse_decode_kernel[(B, 1, nsplit)](
        p_q=q, p_kv=kv, p_idx=swa_indices, p_len=swa_lengths, p_o_part=o_part, p_lse_part=lse_part,
        stride_qb=q.stride(0), stride_kv=kv.stride(0),
        stride_iw=swa_indices.stride(0), stride_ix=stride_ix, H=H, qk_scale_log2=scale * LOG2E, x_delta=x_delta,
        idx_x_delta=idx_x_delta, len_x_delta=len_x_delta, KW=swa_indices.shape[1], KX=kx, NSPLIT=nsplit, D=D, BH=H, BK=BLOCK_K, PRODUCER_REGS_=ws.PRODUCER_REGS,
        ABLATE_=ws.ABLATE, num_warps=8,
    )
