"""Sparse decode attention as plain torch ops in the input dtype: gather, bmm, softmax, bmm.

What a framework does without a dedicated kernel; the benchmark's second point of comparison.
"""

from __future__ import annotations

import torch

from dsv4opt.workload.attention.naive import used_slots


def sparse_decode_torch(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    lengths: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `attention` slot (dsv4opt/workload/impls.py) with torch ops.

    q: [B, H, D] bf16, kv: [N, D] bf16, indices: [B, K] int32, lengths: [B] int32, sink: [H] fp32.
    Returns o: [B, H, D] in q's dtype and lse: [B, H] fp32. No host synchronisation.
    """
    used = used_slots(indices, lengths)  # [B, K]
    rows = kv[indices.clamp(min=0).long()]  # [B, K, D]
    scores = torch.bmm(q, rows.transpose(1, 2)).float() * scale  # [B, H, K]
    scores = scores.masked_fill(~used[:, None, :], float("-inf"))
    sink_logit = sink.float()[None, :, None].expand(q.shape[0], -1, 1)  # [B, H, 1]
    logits = torch.cat([scores, sink_logit], dim=-1)  # [B, H, K + 1]
    lse = torch.logsumexp(logits, dim=-1)  # [B, H]
    weights = torch.exp(scores - lse[..., None])  # [B, H, K]
    o = torch.bmm(weights.to(q.dtype), rows)
    return o, lse
