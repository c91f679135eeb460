"""The baseline sparse decode kernel: SGLang's sm_120 Triton kernel, reproduced in our own code.

Stands for `_tiled_sparse_decode_kernel` (layers/attention/flash_mla_sm120_triton.py at
sgl-project/sglang@37ef295c7): one program per (request, head); dot products as multiply-and-sum on
CUDA cores (no tl.dot); every head re-reads the same selected KV rows; no split over the selected
entries; the FP8 cache is dequantised in the kernel. It computes attention over one cache only and
leaves the attention sink out: the caller merges the window and compressed results and applies the
sink (`dsv4opt/workload/attention/sm120.py`), as SGLang does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import LN2, LOG2E
from dsv4opt.workload.kvcache import KVCache

# Running max before any used slot: finite, so exp2(m_old - m_new) never evaluates inf - inf.
_NO_SCORE = tl.constexpr(-1.0e30)
LN2_ = tl.constexpr(LN2)


@triton.jit
def _simt_sparse_decode_kernel(
    p_q, p_kv, p_kv8, p_kvu8, p_kv16, p_idx, p_len, p_o, p_lse,
    stride_qb, stride_qh, stride_kv, stride_ib, stride_ob, stride_oh,
    H, qk_scale_log2, page_size, page_bytes,
    K: tl.constexpr, DN: tl.constexpr, DR: tl.constexpr, D_P: tl.constexpr, BK: tl.constexpr,
    FP8: tl.constexpr, TILE: tl.constexpr, DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_h = tl.program_id(1)
    o_d = tl.arange(0, D_P)
    m_d = o_d < DN + DR
    m_nope = o_d < DN
    b_q = tl.load(p_q + i_b * stride_qb + i_h * stride_qh + o_d, mask=m_d, other=0.0).to(tl.float32)  # [D_P]
    n_used = tl.load(p_len + i_b)

    b_m = tl.max(tl.full([BK], _NO_SCORE, tl.float32), axis=0)
    b_l = tl.sum(tl.zeros([BK], tl.float32), axis=0)
    b_acc = tl.zeros([D_P], tl.float32)  # [D_P]
    # Compile-time loop bounds (the interpreter cannot loop to a run-time scalar); slots past
    # lengths[b] or marked -1 are masked, so their rows are never read.
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        b_idx = tl.load(p_idx + i_b * stride_ib + o_k, mask=(o_k < K) & (o_k < n_used), other=-1)  # [BK]
        m_k = b_idx >= 0
        t = tl.where(m_k, b_idx, 0).to(tl.int64)
        if FP8:
            page = t // page_size
            slot = t % page_size
            at = page * page_bytes + slot * DATA_BYTES  # [BK] first byte of each token's record
            at_s = page * page_bytes + page_size * DATA_BYTES + slot * SCALE_BYTES
            m_n = m_k[:, None] & m_nope[None, :]
            b_nope = tl.load(p_kv8 + at[:, None] + o_d[None, :], mask=m_n, other=0.0).to(tl.float32)
            b_e = tl.load(p_kvu8 + at_s[:, None] + (o_d // TILE)[None, :], mask=m_n, other=127).to(tl.float32)
            # rope values are bf16 right after the nope bytes: element (at + DN) / 2 + (d - DN)
            p_rope = p_kv16 + ((at + DN) // 2)[:, None] + (o_d - DN)[None, :]
            b_rope = tl.load(p_rope, mask=m_k[:, None] & (o_d[None, :] >= DN) & m_d[None, :], other=0.0).to(tl.float32)
            b_kv = tl.where(m_n, b_nope * tl.exp2(b_e - 127.0), b_rope)  # [BK, D_P]
        else:
            p_rows = p_kv + t[:, None] * stride_kv + o_d[None, :]
            b_kv = tl.load(p_rows, mask=m_k[:, None] & m_d[None, :], other=0.0).to(tl.float32)  # [BK, D_P]
        b_s = tl.sum(b_kv * b_q[None, :], axis=1) * qk_scale_log2  # [BK]
        b_s = tl.where(m_k, b_s, float("-inf"))
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=0))
        b_alpha = tl.exp2(b_m - b_m_new)
        b_p = tl.exp2(b_s - b_m_new)  # [BK]
        b_l = b_l * b_alpha + tl.sum(b_p, axis=0)
        b_acc = b_acc * b_alpha + tl.sum(b_p[:, None] * b_kv, axis=0)
        b_m = b_m_new

    b_safe = tl.where(b_l > 0.0, b_l, 1.0)
    tl.store(p_o + i_b * stride_ob + i_h * stride_oh + o_d, (b_acc / b_safe).to(p_o.dtype.element_ty), mask=m_d)
    b_lse = tl.where(b_l > 0.0, (b_m + tl.log2(b_safe)) * LN2_, float("-inf"))
    tl.store(p_lse + i_b * H + i_h, b_lse)



def check_attention_inputs(q, indices, lengths) -> None:
    """Internal invariants of one call (shapes, dtypes, layouts), shared by the kernels."""
    assert q.dim() == 3 and q.stride(2) == 1, q.shape
    assert indices.dim() == 2 and indices.shape[0] == q.shape[0] and indices.stride(1) == 1, indices.shape
    assert lengths.shape == (q.shape[0],), lengths.shape
    assert indices.dtype == torch.int32 and lengths.dtype == torch.int32, (indices.dtype, lengths.dtype)


def sparse_decode_simt(q: torch.Tensor, cache: KVCache, indices: torch.Tensor, lengths: torch.Tensor,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over the tokens `indices` of one cache, no sink, one program per (request, head).

    q: [B, H, D]; indices: [B, K] int32 token numbers (-1 unused); lengths: [B] int32 (slots at or
    past lengths[b] unused). Returns o: [B, H, D] in q's dtype (0 where nothing is used) and
    lse: [B, H] fp32, natural log (-inf where nothing is used). Allocates as SGLang's wrapper does:
    a zero-filled output and a -inf-filled lse, then the kernel.
    """
    check_attention_inputs(q, indices, lengths)
    B, H, D = q.shape
    L = cache.layout
    assert L.dim == D, (L.dim, D)
    o = torch.zeros_like(q)
    lse = torch.full((B, H), float("-inf"), device=q.device, dtype=torch.float32)
    if L.fp8:
        kv8, kvu8, kv16 = cache.views()
        kv, stride_kv = kvu8, 0
    else:
        kv8 = kvu8 = kv16 = kv = cache.data
        stride_kv = cache.data.stride(0)
    _simt_sparse_decode_kernel[(B, H)](
        p_q=q, p_kv=kv, p_kv8=kv8, p_kvu8=kvu8, p_kv16=kv16, p_idx=indices, p_len=lengths, p_o=o, p_lse=lse,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_kv=stride_kv, stride_ib=indices.stride(0),
        stride_ob=o.stride(0), stride_oh=o.stride(1),
        H=H, qk_scale_log2=scale * LOG2E, page_size=L.page_size, page_bytes=L.page_bytes if L.fp8 else 0,
        K=indices.shape[1], DN=L.nope, DR=L.rope, D_P=triton.next_power_of_2(D), BK=16,
        FP8=L.fp8, TILE=L.tile, DATA_BYTES=L.data_bytes, SCALE_BYTES=L.scale_bytes,
        num_warps=4,
    )
    return o, lse
