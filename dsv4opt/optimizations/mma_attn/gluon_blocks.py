"""The Gluon (Hopper) pieces mma-attn's warp-specialised loops share: the FP8 layout's geometry,
each split's share of a request's used slots (`split_slots`), the index ring (`tile_indices`,
`tile_rows`), the QK / online-softmax / PV products of one tile (`tile_products`) and a split's
normalised result (`split_result`).

They were first written for a single-partition FP8 loop that gathered two tiles ahead
(kernel_gluon_fp8.py until the dispatch became one decision; docs/kernels/mma_attn.md,
"Experiments kept in history"); ws_blocks.py, kernel_gluon_fp8_ws.py, kernel_gluon_bf16_ws.py
and kernel_gluon.py now use them. GPU only (the interpreter cannot run Gluon), Triton 3.6 only
(dispatch.GLUON_VALIDATED_TRITON).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma

# The geometry this loop is written for (DeepSeek-V4-Flash's FP8 layout, kvcache.py): 7 tiles of 64
# e4m3 nope values, 64 bf16 rope values, 576-byte data records and 8-byte scale records.
NOPE_TILES = 7
TILE = 64
ROPE = 64
DATA_BYTES = 576
SCALE_BYTES = 8
HEADS = 64  # one warpgroup's MMA rows
BLOCK_K = 64
# Tile rows of indices in shared memory, a ring (1 KiB): the loops read tile t's row (scores' mask)
# and issue tile t + 2's gather, and refill the row of a tile every warp is past with one read
# ahead into registers, so the staging does not grow with the rows' width.
IDX_RING = 4

# the chunk's indices in shared memory, flat, viewed as rows of a tile (or of a sub-tile)
IDX_SMEM = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
# the same, for the kernels (Triton reads globals only as constexprs)
NOPE_TILES_ = gl.constexpr(NOPE_TILES)
TILE_ = gl.constexpr(TILE)
ROPE_ = gl.constexpr(ROPE)
DATA_BYTES_ = gl.constexpr(DATA_BYTES)
SCALE_BYTES_ = gl.constexpr(SCALE_BYTES)
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
def tile_rows(idx_rows, row, pos0, n_w, x_delta, ROWS: gl.constexpr, PS_W: gl.constexpr,
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
    at = gl.where(in_x, x_delta + page_x * PB_X + slot_x * DATA_BYTES_, page_w * PB_W + slot_w * DATA_BYTES_)
    at_s = gl.where(in_x, x_delta + page_x * PB_X + PS_X * DATA_BYTES_ + slot_x * SCALE_BYTES_,
                    page_w * PB_W + PS_W * DATA_BYTES_ + slot_w * SCALE_BYTES_)
    return at, at_s, m_row


@gluon.jit
def tile_products(q_smem, kv_t, idx_smem, row, b_m, b_l, b_acc, qk_scale_log2, BH: gl.constexpr, BK: gl.constexpr):
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
def split_result(p_lse_part, b_acc, b_m, b_l, i_b, i_s, H, NSPLIT: gl.constexpr, BH: gl.constexpr,
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
