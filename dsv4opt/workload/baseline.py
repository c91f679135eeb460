"""The baseline: SGLang's sm_120 fallbacks, reproduced with real kernels (see docs/workload.md).

- attention: the CUDA-core (SIMT) Triton sparse-decode kernel, one program per (request, head);
- indexer score: dequantise the fp8 index keys to float32, float32 `torch.bmm`, ReLU, weighted
  sum over index heads;
- hyper-connection pre-mix: float32 `F.linear`.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F


def attention_simt(q, kv, indices, lengths, sink, scale):
    """Slot `attention` (signature in dsv4opt/workload/impls.py); Triton imported on first use.

    On a CPU, Triton runs only under its interpreter (TRITON_INTERPRET=1, used by the tests); other
    CPU runs take SGLang's plain-torch path, which computes the same function.
    """
    if q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        from dsv4opt.workload.attention.simt import sparse_decode_simt

        return sparse_decode_simt(q, kv, indices, lengths, sink, scale)
    from dsv4opt.workload.attention.torch_path import sparse_decode_torch

    return sparse_decode_torch(q, kv, indices, lengths, sink, scale)


def indexer_score_fp32(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """q: [B, Hi, Di], k: [B, S, Di] fp8, k_scale: [B, S], w: [B, Hi] -> scores [B, S] fp32."""
    keys = k.float() * k_scale.float()[:, :, None]  # [B, S, Di]
    logits = torch.bmm(keys, q.float().transpose(1, 2))  # [B, S, Hi]
    return torch.bmm(torch.relu(logits), w.float()[:, :, None]).squeeze(-1)


def hc_premix_fp32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [T, n*hidden] fp32, weight: [24, n*hidden] -> [T, 24] fp32."""
    return F.linear(x.float(), weight.float())


IMPLEMENTATIONS = {
    "attention": attention_simt,
    "indexer_score": indexer_score_fp32,
    "hc_premix": hc_premix_fp32,
}
