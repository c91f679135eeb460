"""The baseline sparse decode kernel: SGLang's sm_120 Triton fallback, reproduced.

One program per (request, head); dot products as multiply-and-sum on CUDA cores (no tl.dot); every
head re-reads the same selected KV rows; no split over the selected entries. Slow on purpose: it is
what the profile of the baseline workload should show.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
# Running max before any used slot: finite, so exp2(m_old - m_new) never evaluates inf - inf.
_NO_SCORE = tl.constexpr(-1.0e30)


@triton.jit
def _simt_sparse_decode_kernel(
    p_q, p_kv, p_idx, p_len, p_sink, p_o, p_lse,
    stride_qb, stride_qh, stride_kv, stride_ib, stride_ob, stride_oh,
    H, qk_scale_log2,
    K: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, BK: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_h = tl.program_id(1)
    o_d = tl.arange(0, D_P)
    m_d = o_d < D
    b_q = tl.load(p_q + i_b * stride_qb + i_h * stride_qh + o_d, mask=m_d, other=0.0).to(tl.float32)  # [D_P]
    n_used = tl.load(p_len + i_b)

    b_m = tl.max(tl.full([BK], _NO_SCORE, tl.float32), axis=0)
    b_l = tl.sum(tl.zeros([BK], tl.float32), axis=0)
    b_acc = tl.zeros([D_P], tl.float32)  # [D_P]
    # Loop bounds are compile-time (K constexpr): Triton's interpreter cannot loop to a run-time
    # scalar with numpy 2. Slots past the context are masked, so their rows are never read.
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        b_idx = tl.load(p_idx + i_b * stride_ib + o_k, mask=(o_k < K) & (o_k < n_used), other=-1)  # [BK]
        m_k = b_idx >= 0
        p_rows = p_kv + tl.where(m_k, b_idx, 0).to(tl.int64)[:, None] * stride_kv + o_d[None, :]
        b_kv = tl.load(p_rows, mask=m_k[:, None] & m_d[None, :], other=0.0).to(tl.float32)  # [BK, D_P]
        b_s = tl.sum(b_kv * b_q[None, :], axis=1) * qk_scale_log2  # [BK]
        b_s = tl.where(m_k, b_s, float("-inf"))
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=0))
        b_alpha = tl.exp2(b_m - b_m_new)
        b_p = tl.exp2(b_s - b_m_new)  # [BK]
        b_l = b_l * b_alpha + tl.sum(b_p, axis=0)
        b_acc = b_acc * b_alpha + tl.sum(b_p[:, None] * b_kv, axis=0)
        b_m = b_m_new

    b_sink = tl.load(p_sink + i_h).to(tl.float32) * 1.4426950408889634
    b_top = tl.maximum(b_m, b_sink)
    b_w = tl.exp2(b_m - b_top)
    b_den = b_l * b_w + tl.exp2(b_sink - b_top)
    b_o = b_acc * (b_w / b_den)
    tl.store(p_o + i_b * stride_ob + i_h * stride_oh + o_d, b_o.to(p_o.dtype.element_ty), mask=m_d)
    tl.store(p_lse + i_b * H + i_h, (b_top + tl.log2(b_den)) * 0.6931471805599453)


def check_attention_inputs(q, kv, indices, lengths, sink) -> None:
    """Internal invariants of the `attention` slot (shapes, dtypes, layouts), shared by the kernels."""
    assert q.dim() == 3 and kv.dim() == 2 and q.shape[2] == kv.shape[1], (q.shape, kv.shape)
    assert indices.dim() == 2 and indices.shape[0] == q.shape[0], indices.shape
    assert lengths.shape == (q.shape[0],) and sink.shape == (q.shape[1],), (lengths.shape, sink.shape)
    assert indices.dtype == torch.int32 and lengths.dtype == torch.int32, (indices.dtype, lengths.dtype)
    assert q.stride(2) == 1 and kv.stride(1) == 1 and indices.stride(1) == 1, "inner dims must be contiguous"
    assert len({t.device for t in (q, kv, indices, lengths, sink)}) == 1, "all inputs on one device"


def sparse_decode_simt(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    lengths: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `attention` slot (dsv4opt/workload/impls.py), one program per (request, head).

    q: [B, H, D] bf16, kv: [N, D] bf16, indices: [B, K] int32 (-1 unused), lengths: [B] int32,
    sink: [H] fp32. Returns o: [B, H, D] in q's dtype and lse: [B, H] fp32.
    """
    check_attention_inputs(q, kv, indices, lengths, sink)
    B, H, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(B, H, device=q.device, dtype=torch.float32)
    _simt_sparse_decode_kernel[(B, H)](
        q, kv, indices, lengths, sink, o, lse,
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), o.stride(0), o.stride(1),
        H, scale * _LOG2E,
        K=indices.shape[1], D=D, D_P=triton.next_power_of_2(D), BK=16,
        num_warps=4,
    )
    return o, lse
