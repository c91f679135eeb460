"""Host-side operand arithmetic every mma-attn launcher shares (a leaf: it imports no kernel file)."""

from __future__ import annotations

import torch

from dsv4opt.workload.kvcache import KVCache


def _offset(a: torch.Tensor, base: torch.Tensor, unit: int) -> int:
    """Where `a` starts relative to `base`, in elements of `unit` bytes (the kernel reads both through base's pointer)."""
    delta = a.data_ptr() - base.data_ptr()
    assert delta % unit == 0, (delta, unit)
    return delta // unit


def extra_offsets(swa: KVCache, swa_indices, swa_lengths, extra: KVCache | None, extra_indices,
                  extra_lengths) -> tuple[int, int, int, int, int]:
    """(x_delta, idx_x_delta, len_x_delta, stride_ix, kx) of a launch over both caches: where the
    compressed cache's data (in the window cache's data elements: bytes for FP8, elements for bf16),
    indices and lengths start relative to the window's, its indices' row stride and width. The
    one-launch kernels read both caches through the window's pointers; all 0 on a window-only layer."""
    if extra is None:
        return 0, 0, 0, 0, 0
    return (_offset(extra.data, swa.data, swa.data.element_size()), _offset(extra_indices, swa_indices, 4),
            _offset(extra_lengths, swa_lengths, 4), extra_indices.stride(0), extra_indices.shape[1])
