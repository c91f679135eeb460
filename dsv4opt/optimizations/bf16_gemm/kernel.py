"""bf16 tensor-core versions of the indexer logits and the hyper-connection pre-mix.

Both keep fp32 accumulation and never round an intermediate to bf16: the indexer kernel applies
ReLU, the head weights, the head sum and the key scale to the fp32 dot products in registers (a
bf16 `torch.bmm` would round every head's logit to 8 bits before the ReLU, which is where top-k
swaps come from), and the pre-mix kernel rounds only its inputs. Maths and byte counts:
docs/optimizations/bf16_gemm.md.

On CUDA the Triton kernels run; on a CPU under the interpreter they run with fp16 operands (exact
for the e4m3 indexer operands; the interpreter cannot multiply bf16), elsewhere on a CPU a torch
emulation computes the same thing.
"""

from __future__ import annotations

import os
import weakref

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import compile_only
from dsv4opt.workload.kernels.indexer_tc import index_logits_tc

# Programs the pre-mix split-K aims for: about one per SM on an H200 (132 SMs).
_PREMIX_TARGET_PROGRAMS = 128
# Triton picks interpreter or compiler when a kernel is defined, i.e. at this module's import.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def indexer_logits(q8: torch.Tensor, weights: torch.Tensor, cache, seq_lens: torch.Tensor,
                   page_table: torch.Tensor, max_len: int) -> torch.Tensor:
    """The `indexer_logits` slot on bf16 tensor cores (dsv4opt/workload/kernels/indexer_tc.py)."""
    return index_logits_tc(q8, weights, cache, seq_lens, page_table, max_len, operands="bf16")


@triton.jit
def _premix_mm_kernel(
    p_x, p_w, p_part,
    T, N, K,
    s_xt, s_wn, s_ps, s_pt,
    K_PER_SPLIT: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    i_t = tl.program_id(0)
    i_split = tl.program_id(1).to(tl.int64)
    o_t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_n = tl.arange(0, BLOCK_N)
    m_t = o_t < T
    m_n = o_n < N
    k_lo = i_split * K_PER_SPLIT
    b_acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)  # [BT, BN]
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        o_k = k_lo + k0 + tl.arange(0, BLOCK_K)
        m_k = (o_k < K) & (k0 + tl.arange(0, BLOCK_K) < K_PER_SPLIT)
        b_x = tl.load(p_x + o_t[:, None].to(tl.int64) * s_xt + o_k[None, :],
                      mask=m_t[:, None] & m_k[None, :], other=0.0)  # [BT, BK] fp32
        b_w = tl.load(p_w + o_n[:, None] * s_wn + o_k[None, :],
                      mask=m_n[:, None] & m_k[None, :], other=0.0)  # [BN, BK] bf16
        b_acc += tl.dot(b_x.to(p_w.dtype.element_ty), tl.trans(b_w))
    p_out = p_part + i_split * s_ps + o_t[:, None] * s_pt + o_n[None, :]
    tl.store(p_out, b_acc, mask=m_t[:, None] & m_n[None, :])


def _use_triton(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type == "cuda" or compile_only():
        return True
    # The interpreter runs fp16 dots correctly but not bf16 ones (it multiplies bit patterns).
    return _INTERPRETED and dtype != torch.bfloat16


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


def hc_premix_lowp(x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The pre-mix linear with `dtype` operands (bf16; fp16 in interpreter tests), fp32 accumulation.

    x: [T, K] fp32; weight: [N, K] (any float dtype; a converted copy is cached) -> [T, N] fp32.
    """
    T, K = x.shape
    N = weight.shape[0]
    assert weight.shape == (N, K), "shape mismatch"
    w = cached_cast(weight, dtype)
    if not _use_triton(x.device, dtype):
        return torch.mm(x.to(dtype).float(), w.float().t())
    x = x if x.stride(-1) == 1 else x.contiguous()
    BLOCK_T = min(64, _pow2(T))
    BLOCK_K = 128
    n_t = triton.cdiv(T, BLOCK_T)
    n_split = max(1, min(triton.cdiv(K, BLOCK_K), _PREMIX_TARGET_PROGRAMS // n_t))
    k_per_split = triton.cdiv(triton.cdiv(K, n_split), BLOCK_K) * BLOCK_K
    n_split = triton.cdiv(K, k_per_split)
    # Partials then a sum, rather than atomics: the result does not depend on program order.
    part = torch.empty((n_split, T, N), device=x.device, dtype=torch.float32)
    if T == 0:
        return part.sum(0)
    _premix_mm_kernel[(n_t, n_split)](
        x, w, part, T, N, K,
        x.stride(0), w.stride(0), part.stride(0), part.stride(1),
        K_PER_SPLIT=k_per_split,
        BLOCK_T=BLOCK_T, BLOCK_N=_pow2(N), BLOCK_K=BLOCK_K,
    )
    return part.sum(0)


# id(weight) -> (weakref to weight, weight._version, converted copy). Weights live for the model's
# lifetime, so converting once and reusing keeps the per-call cost to the GEMM itself; the version
# check catches in-place updates, and the weakref drops the copy with its weight.
_CAST_CACHE: dict[tuple[int, torch.dtype], tuple[weakref.ref, int, torch.Tensor]] = {}


def cached_cast(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight in `dtype`, contiguous; converted once per (weight, dtype) and reused.

    Inside a CUDA-graph capture a cache miss still works (the cast is recorded into the graph);
    warm-up before capture makes every call a hit.
    """
    if weight.dtype == dtype and weight.is_contiguous():
        return weight
    key = (id(weight), dtype)
    hit = _CAST_CACHE.get(key)
    if hit is not None and hit[0]() is weight and hit[1] == weight._version:
        return hit[2]
    converted = weight.detach().to(dtype).contiguous()
    _CAST_CACHE[key] = (weakref.ref(weight, lambda _ref, key=key: _CAST_CACHE.pop(key, None)),
                        weight._version, converted)
    return converted


def hc_premix(x, weight):
    """The `hc_premix` slot (dsv4opt.workload.impls): bf16 tensor cores, fp32 accumulation."""
    return hc_premix_lowp(x, weight, torch.bfloat16)
