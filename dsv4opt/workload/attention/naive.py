"""The definition of correct for sparse-MLA decode attention (the `attention` slot), in float64."""

from __future__ import annotations

import torch

from dsv4opt.workload.kvcache import KVCache


def used_slots(indices: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[B, K] bool: a slot is used when its index is >= 0 and its position is < lengths[b]."""
    positions = torch.arange(indices.shape[1], device=indices.device)
    return (indices >= 0) & (positions[None, :] < lengths.to(indices.device)[:, None])


def sparse_attention_ref(q, swa: KVCache, swa_indices, swa_lengths, extra: KVCache | None, extra_indices,
                         extra_lengths, sink, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention with a sink over the used tokens of both caches, computed in float64.

    Rows are decoded exactly from the cache layout. Returns o: [B, H, D] float64 and lse: [B, H]
    float64 (natural log, sink included). A request with no used slot gets o = 0 and lse = sink.
    """
    parts = [(swa, swa_indices, swa_lengths)] + ([(extra, extra_indices, extra_lengths)] if extra is not None else [])
    B = q.shape[0]
    rows, used = [], []
    for cache, idx, lengths in parts:
        K = idx.shape[1]
        rows.append(cache.read(idx.clamp(min=0).reshape(-1).cpu() if not cache.data.is_cuda else idx.clamp(min=0).reshape(-1),
                               torch.float64).cpu().view(B, K, -1))
        used.append(used_slots(idx, lengths).cpu())
    rows_all, used_all = torch.cat(rows, dim=1), torch.cat(used, dim=1)  # [B, K, D], [B, K]
    scores = scale * torch.einsum("bhd,bkd->bhk", q.double().cpu(), rows_all)
    scores = scores.masked_fill(~used_all[:, None, :], float("-inf"))
    sink_logit = sink.double().cpu()[None, :, None].expand(B, -1, 1)
    lse = torch.logsumexp(torch.cat([scores, sink_logit], dim=-1), dim=-1)  # [B, H]
    o = torch.einsum("bhk,bkd->bhd", torch.exp(scores - lse[..., None]), rows_all)
    return o, lse
