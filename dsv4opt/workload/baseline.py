"""The baseline: SGLang's sm_120 path, reproduced with our own kernels (see docs/workload.md).

- attention: `flash_mla_sparse_decode_triton`: the CUDA-core Triton kernel over the window cache,
  then the compressed cache, eager LSE merge and sink (dsv4opt/workload/attention/sm120.py);
- indexer logits: `fp8_paged_mqa_logits_torch_sm120`: keys dequantised to float32, float32
  `torch.bmm` (dsv4opt/workload/kernels/indexer.py);
- hyper-connection pre-mix: float32 `F.linear` (deepseek_v4.py:1246-1252, inside the compiled
  `hc_pre_torch_impl`; a cuBLAS FP32 SIMT GEMM).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4opt.workload.attention.sm120 import sparse_decode_sm120
from dsv4opt.workload.kernels.indexer import index_logits_torch


def hc_premix_fp32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [T, n*hidden] fp32, weight: [24, n*hidden] fp32 -> [T, 24] fp32."""
    return F.linear(x.float(), weight.float())


IMPLEMENTATIONS = {
    "attention": sparse_decode_sm120,
    "indexer_logits": index_logits_torch,
    "hc_premix": hc_premix_fp32,
}
