"""Sparse-MLA decode attention of the workload: the float64 reference, SGLang's sm_120 entry point
(two CUDA-core kernel calls, eager merge and sink) and a plain-torch path for one cache."""

from dsv4opt.workload.attention.naive import sparse_attention_ref, used_slots
from dsv4opt.workload.attention.sm120 import sparse_decode_sm120

__all__ = ["sparse_attention_ref", "sparse_decode_sm120", "used_slots"]
