"""The float32 path that bf16-gemm must agree with: the definition of correct.

These are the sm_120 fallbacks written out in plain torch (dequantise, float32 matmul), plus the
pieces downstream of the two GEMMs that decide what the model does with their outputs: the top-k
selection over indexer scores and the hyper-connection Sinkhorn split of the pre-mix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def indexer_score_ref(
    q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, w: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Indexer scores the way the baseline computes them.

    q: [B, Hi, Di] bf16; k: [B, S, Di] float8_e4m3fn; k_scale: [B, S] fp32; w: [B, Hi] fp32
    -> [B, S] fp32 = sum_j w[b, j] * relu(q[b, j] . (k[b, s] * k_scale[b, s])).
    `dtype` float64 gives a reference for the reference.
    """
    keys = k.to(dtype) * k_scale.to(dtype).unsqueeze(-1)  # [B, S, Di]
    logits = torch.bmm(q.to(dtype), keys.transpose(1, 2))  # [B, Hi, S]
    scores = (torch.relu(logits) * w.to(dtype).unsqueeze(-1)).sum(dim=1)  # [B, S]
    return scores.to(torch.float32)


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


def hc_split_sinkhorn(
    mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, n: int, iters: int, eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 24 pre-mix numbers -> (pre [T, n], post [T, n], comb [T, n, n] doubly stochastic).

    Used only while dsv4opt.workload has no Sinkhorn of its own (check.py prefers the workload's).
    mix: [T, 2n + n*n] fp32; scale: [3] fp32 (pre, post, comb gains); base: [2n + n*n] fp32 biases.
    """
    pre, post, comb = mix.float().split([n, n, n * n], dim=-1)
    pre = torch.sigmoid(pre * scale[0] + base[:n]) + eps
    post = 2 * torch.sigmoid(post * scale[1] + base[n:2 * n])
    comb = (comb * scale[2] + base[2 * n:]).unflatten(-1, (n, n))
    comb = comb.softmax(-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb
