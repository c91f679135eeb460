"""Attention over one cache as plain torch ops: gather and decode the rows, scores, softmax, sum.

What a framework does without a dedicated kernel (SGLang's `_sm120_sparse_decode_fwd` torch path
plays this part); the workload's path on a CPU outside Triton's interpreter, and the benchmark's
second point of comparison.
"""

from __future__ import annotations

import torch

from dsv4opt.workload.attention.naive import used_slots
from dsv4opt.workload.kvcache import KVCache


def sparse_decode_torch(q: torch.Tensor, cache: KVCache, indices: torch.Tensor, lengths: torch.Tensor,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as `sparse_decode_simt` (no sink; o = 0 and lse = -inf where nothing is used)."""
    B, K = indices.shape
    used = used_slots(indices, lengths)  # [B, K]
    rows = cache.read(indices.clamp(min=0).reshape(-1), torch.float32).view(B, K, -1)  # [B, K, D]
    scores = torch.bmm(q.float(), rows.transpose(1, 2)) * scale  # [B, H, K]
    scores = scores.masked_fill(~used[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, H]; -inf where nothing is used
    weights = torch.exp(scores - lse.clamp(min=-1e30)[..., None])  # [B, H, K]
    o = torch.bmm(weights, rows)
    return o.to(q.dtype), lse
