"""The reference mma-attn must match: the workload's float64 sparse attention."""

from dsv4opt.workload.attention.naive import sparse_attention_ref

__all__ = ["sparse_attention_ref"]
