"""The definition of correct for sparse-MLA decode attention (the `attention` slot), in float64."""

from __future__ import annotations

import torch


def used_slots(indices: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, K] bool: a slot is used when its index is >= 0 and its position is < lengths[b]."""
    positions = torch.arange(indices.shape[1], device=indices.device)
    return (indices >= 0) & (positions[None, :] < lengths.to(indices.device)[:, None])


def sparse_attention_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    lengths: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch sparse decode attention with an attention sink, computed in float64.

    q: [B, H, D], kv: [N, D] (K = V = the latent), indices: [B, K] int (-1 = unused),
    lengths: [B] int, sink: [H], scale: float.
    Returns o: [B, H, D] float64 and lse: [B, H] float64 (natural log, sink included).
    A request with no used slot gets o = 0 and lse = sink; nothing is NaN.
    Callers cast to the slot contract's dtypes (o in q's dtype, lse fp32) when they need it.
    """
    used = used_slots(indices, lengths)  # [B, K]
    rows = kv.double()[indices.clamp(min=0).long()]  # [B, K, D]
    scores = scale * torch.einsum("bhd,bkd->bhk", q.double(), rows)  # [B, H, K]
    scores = scores.masked_fill(~used[:, None, :], float("-inf"))
    sink_logit = sink.double().to(q.device)[None, :, None].expand(q.shape[0], -1, 1)  # [B, H, 1]
    lse = torch.logsumexp(torch.cat([scores, sink_logit], dim=-1), dim=-1)  # [B, H]
    weights = torch.exp(scores - lse[..., None])  # [B, H, K], 0 where unused
    o = torch.einsum("bhk,bkd->bhd", weights, rows)
    return o, lse
