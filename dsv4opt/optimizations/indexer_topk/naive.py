"""What indexer-topk must compute: the `indexer_topk` slot's float64 reference on the keys the page
table names (dsv4opt/workload/kernels/naive.index_topk), with the float64 scores it ranks and
each score's absolute sum of terms, the size fp32 summation error is proportional to."""

from __future__ import annotations

import torch

from dsv4opt.workload.kernels.naive import index_logits, index_topk  # noqa: F401  (the slot's definition)


def gathered_keys(cache, page_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys [B, W, dim], scales [B, W]) in float64 at every slot of the page table's width W."""
    B, P = page_table.shape
    s = torch.arange(P * cache.page_size, device=page_table.device)
    entries = (page_table.long()[:, s // cache.page_size] * cache.page_size + s % cache.page_size).reshape(-1)
    keys, scales = cache.read(entries, torch.float64)
    return keys.view(B, -1, cache.dim), scales.view(B, -1)


def reference(q8, weights, cache, seq_lens, page_table, base, topk: int):
    """(indices [B, topk] int64, scores [B, W] float64 (-inf past seq_lens), abs_sum [B, W] float64):
    the slot's output in float64, the scores it ranks, and scale_s * sum_h |w_h| sum_d |q_hd k_sd|.
    W covers the longest request's pages only (the rest of a graph-wide table is -inf by definition)."""
    longest = int(seq_lens.max()) if seq_lens.numel() else 0
    pages = min(page_table.shape[1], max(1, -(-longest // cache.page_size)))
    keys, scales = gathered_keys(cache, page_table[:, :pages])
    q = q8.double()
    scores = index_logits(q, weights, keys, scales, seq_lens)
    abs_sum = (weights.double().abs()[:, :, None] * torch.einsum("bhd,bsd->bhs", q.abs(), keys.abs())).sum(1)
    abs_sum = abs_sum * scales.abs()
    return index_topk(q, weights, keys, scales, seq_lens, base, topk), scores, abs_sum
