"""FlashMLA's lse from mma-attn's, in one launch: for the Hopper slot of SGLang 0.5.23.

mma-attn's lse includes the sink (its slot contract, dsv4opt/workload/slots.py); FlashMLA returns the
log-sum-exp of the scores alone, and +inf for a request none of whose slots is used (sgl-flash-mla
1.0.0, flash_mla_interface.py:142-159; FlashMLA's tests/ref.py). Since lse = log(exp(l) + exp(sink)),
l = lse + log(1 - exp(sink - lse)): exact algebra, whose rounding grows as 1 / (1 - exp(sink - lse))
when the sink outweighs every used score (docs/sglang.md, "The Hopper slot"). Which requests use no
slot is read from the indices and lengths, not from the lse, which rounds near the sink.

In eager torch this is about seven launches (the subtraction, exp, log, the used-slot test, where);
here it is one, of one program per request.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _lse_without_sink_kernel(
    p_lse, p_sink, p_out,
    p_idx_w, p_len_w, stride_w, K_W,
    p_idx_x, p_len_x, stride_x, K_X,
    H, HAS_X: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KW: tl.constexpr, BLOCK_KX: tl.constexpr,
):
    """One program per request: whether any slot of either cache is used, then the lse of each head."""
    i_b = tl.program_id(0)
    o_kw = tl.arange(0, BLOCK_KW)
    b_len_w = tl.load(p_len_w + i_b)
    b_idx_w = tl.load(p_idx_w + i_b.to(tl.int64) * stride_w + o_kw, mask=o_kw < K_W, other=-1)  # [BLOCK_KW]
    b_used = tl.sum(((b_idx_w >= 0) & (o_kw < b_len_w)).to(tl.int32), axis=0)
    if HAS_X:
        o_kx = tl.arange(0, BLOCK_KX)
        b_len_x = tl.load(p_len_x + i_b)
        b_idx_x = tl.load(p_idx_x + i_b.to(tl.int64) * stride_x + o_kx, mask=o_kx < K_X, other=-1)  # [BLOCK_KX]
        b_used += tl.sum(((b_idx_x >= 0) & (o_kx < b_len_x)).to(tl.int32), axis=0)
    o_h = tl.arange(0, BLOCK_H)
    m_h = o_h < H
    b_lse = tl.load(p_lse + i_b * H + o_h, mask=m_h, other=0.0)  # [BLOCK_H]
    b_sink = tl.load(p_sink + o_h, mask=m_h, other=0.0).to(tl.float32)  # [BLOCK_H]
    b_rest = 1.0 - tl.exp(tl.minimum(b_sink - b_lse, 0.0))
    b_out = b_lse + tl.log(tl.maximum(b_rest, 1.0e-38))  # 0 only where nothing is used, replaced below
    b_out = tl.where(b_used > 0, b_out, float("inf"))
    tl.store(p_out + i_b * H + o_h, b_out, mask=m_h)


def lse_without_sink(lse: torch.Tensor, sink: torch.Tensor, parts) -> torch.Tensor:
    """lse [B, H] fp32 with the sink [H] fp32 in it -> [B, H] fp32 without it, +inf where no slot of
    `parts` ([(cache, indices [B, K] int32, lengths [B] int32)], one or two) is used."""
    B, H = lse.shape
    (_, idx_w, len_w), *rest = parts
    idx_x, len_x = (rest[0][1], rest[0][2]) if rest else (idx_w, len_w)
    out = torch.empty_like(lse)
    _lse_without_sink_kernel[(B,)](
        p_lse=lse, p_sink=sink, p_out=out,
        p_idx_w=idx_w, p_len_w=len_w, stride_w=idx_w.stride(0), K_W=idx_w.shape[1],
        p_idx_x=idx_x, p_len_x=len_x, stride_x=idx_x.stride(0), K_X=idx_x.shape[1],
        H=H, HAS_X=bool(rest), BLOCK_H=triton.next_power_of_2(H),
        BLOCK_KW=triton.next_power_of_2(idx_w.shape[1]), BLOCK_KX=triton.next_power_of_2(idx_x.shape[1]),
    )
    return out
