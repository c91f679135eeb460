"""Sparse-MLA decode attention of the workload: the float64 reference, the baseline CUDA-core
kernel (SGLang's sm_120 fallback) and a plain-torch path."""

from dsv4opt.workload.attention.naive import sparse_attention_ref, used_slots
from dsv4opt.workload.attention.simt import sparse_decode_simt
from dsv4opt.workload.attention.torch_path import sparse_decode_torch

__all__ = ["sparse_attention_ref", "sparse_decode_simt", "sparse_decode_torch", "used_slots"]
