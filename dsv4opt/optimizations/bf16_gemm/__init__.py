"""bf16-gemm: the indexer logits and the hyper-connection pre-mix on bf16 tensor cores, fp32 accumulation."""

from dsv4opt.optimizations.bf16_gemm.check import check
from dsv4opt.optimizations.bf16_gemm.kernel import hc_premix, indexer_logits

IMPLEMENTATIONS = {"indexer_logits": indexer_logits, "hc_premix": hc_premix}

__all__ = ["IMPLEMENTATIONS", "check", "hc_premix", "indexer_logits"]
