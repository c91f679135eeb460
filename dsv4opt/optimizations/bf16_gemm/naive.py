"""The float32 path bf16-gemm must agree with, and what decides what the model does with its output.

The float32 indexer logits are the baseline's own torch path (dsv4opt/workload/kernels/indexer.py,
the slot's float64 definition is dsv4opt/workload/kernels/naive.index_logits); the pre-mix's is a
float32 `F.linear`. `topk_select` is the selection the indexer's logits feed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4opt.workload.kernels.indexer import index_logits_torch as indexer_logits_fp32  # noqa: F401


def hc_premix_ref(x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x: [T, n * hidden] fp32; weight: [24, n * hidden] -> [T, 24] fp32 (float32 F.linear)."""
    return F.linear(x.to(dtype), weight.to(dtype)).to(torch.float32)


def topk_select(scores: torch.Tensor, lengths: torch.Tensor, top_k: int) -> torch.Tensor:
    """Entries attention sees: the top_k highest scores among each request's first lengths[b].

    scores: [B, S] fp32; lengths: [B] int -> [B, min(top_k, S)] int64, -1 where a request has
    fewer than top_k entries. Ties break by torch.topk's order, the same on both paths.
    """
    n_sel = min(top_k, scores.shape[1])
    pos = torch.arange(scores.shape[1], device=scores.device)
    valid = pos.unsqueeze(0) < lengths.unsqueeze(1)  # [B, S]
    masked = scores.masked_fill(~valid, float("-inf"))
    idx = masked.topk(n_sel, dim=1).indices  # [B, n_sel]
    slot = torch.arange(n_sel, device=scores.device).unsqueeze(0)
    return torch.where(slot < lengths.clamp(max=n_sel).unsqueeze(1), idx, torch.full_like(idx, -1))
