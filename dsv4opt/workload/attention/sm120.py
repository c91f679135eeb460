"""SGLang's sm_120 sparse-decode entry point, reproduced: two kernel calls, an eager merge, an eager sink.

Stands for `flash_mla_sparse_decode_triton` (layers/attention/flash_mla_sm120_triton.py:208-370 at
sgl-project/sglang@37ef295c7): the CUDA-core kernel runs over the window cache, then over the
compressed cache; the two results are merged by their log-sum-exps and the attention sink is folded
in with plain torch operations (about 22 and 9 launches). This is the baseline `attention` slot.
"""

from __future__ import annotations

import torch

from dsv4opt.tritonlib import runs_triton
from dsv4opt.workload.kvcache import KVCache

_EMPTY_LSE = -1e20  # an lse at or below this marks "nothing attended" (the kernel writes -inf)


def merge_partials(o1, lse1, o2, lse2) -> tuple[torch.Tensor, torch.Tensor]:
    """Two attention results over disjoint token sets -> the result over their union (eager torch)."""
    top = torch.maximum(lse1, lse2)
    w1 = torch.where(lse1 > _EMPTY_LSE, torch.exp(lse1 - top), torch.zeros_like(lse1))
    w2 = torch.where(lse2 > _EMPTY_LSE, torch.exp(lse2 - top), torch.zeros_like(lse2))
    total = (w1 + w2).clamp(min=1e-20)
    merged = (w1.unsqueeze(-1) * o1.float() + w2.unsqueeze(-1) * o2.float()) / total.unsqueeze(-1)
    return merged.to(o1.dtype), top + torch.log(total)


def apply_sink(o, lse, sink) -> tuple[torch.Tensor, torch.Tensor]:
    """Add exp(sink[h]) to each head's softmax denominator (eager torch): o shrinks, lse grows."""
    combined = torch.logaddexp(lse, sink.view(1, -1).expand_as(lse))
    w = torch.where(lse > _EMPTY_LSE, torch.exp(lse - combined), torch.zeros_like(lse))
    return (o.float() * w.unsqueeze(-1)).to(o.dtype), combined


def one_cache(q, cache: KVCache, indices, lengths, scale):
    """Attention over one cache without the sink: the Triton kernel, or the torch path on a CPU."""
    if runs_triton(q):
        from dsv4opt.workload.attention.simt import sparse_decode_simt

        return sparse_decode_simt(q, cache, indices, lengths, scale)
    from dsv4opt.workload.attention.torch_path import sparse_decode_torch

    return sparse_decode_torch(q, cache, indices, lengths, scale)


def sparse_decode_sm120(q, swa: KVCache, swa_indices, swa_lengths, extra: KVCache | None, extra_indices,
                        extra_lengths, sink, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline `attention` slot (contract in dsv4opt/workload/slots.py)."""
    o, lse = one_cache(q, swa, swa_indices, swa_lengths, scale)
    if extra is not None:
        o2, lse2 = one_cache(q, extra, extra_indices, extra_lengths, scale)
        o, lse = merge_partials(o, lse, o2, lse2)
    return apply_sink(o, lse, sink)
