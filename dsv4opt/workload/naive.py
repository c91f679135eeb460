"""Plain-torch references: the definition of correct for the baseline pieces this package owns.

The sparse-attention reference lives in dsv4opt/workload/attention/naive.py; the reference of a
whole decode step, in float64, in dsv4opt/workload/reference.py.
"""

from __future__ import annotations

import torch


def indexer_score_ref(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """scores[b, s] = sum_j w[b, j] * relu(q[b, j] . (k[b, s] * k_scale[b, s])), in float64.

    q: [B, Hi, Di], k: [B, S, Di] fp8 e4m3, k_scale: [B, S], w: [B, Hi] -> [B, S] float64.
    """
    keys = k.double() * k_scale.double()[:, :, None]
    dots = torch.einsum("bjd,bsd->bjs", q.double(), keys)
    return (w.double()[:, :, None] * dots.clamp(min=0)).sum(dim=1)


def hc_premix_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """mix[t, m] = sum_i x[t, i] * weight[m, i] in float64. x: [T, n*hidden], weight: [24, n*hidden]."""
    return torch.einsum("ti,mi->tm", x.double(), weight.double())
