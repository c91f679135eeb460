"""bf16 tensor-core versions of the indexer score and the hyper-connection pre-mix.

Both keep fp32 accumulation and never round an intermediate to bf16: the indexer kernel applies
scale, ReLU and the head-weighted sum to the fp32 dot products in registers (a bf16 `torch.bmm`
would round every head's logit to 8 bits before the ReLU, which is where top-k swaps come from),
and the pre-mix kernel rounds only its inputs. Maths and byte counts: docs/optimizations/bf16_gemm.md.

On CUDA the Triton kernels run; on the CPU (no tensor cores, and the Triton interpreter cannot
multiply bf16) a torch emulation computes the same thing: bf16 operands, fp32 products and sums.
"""

from __future__ import annotations

import os
import weakref

import torch
import triton
import triton.language as tl

# Programs the pre-mix split-K aims for: about one per SM on an H200 (132 SMs).
_PREMIX_TARGET_PROGRAMS = 128
# Triton picks interpreter or compiler when a kernel is defined, i.e. at this module's import.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _indexer_score_mm_kernel(
    p_q, p_k, p_scale, p_w, p_out,
    S,
    s_qb, s_qh, s_kb, s_ks, s_sb, s_wb, s_ob,
    H: tl.constexpr, D: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    i_s = tl.program_id(1)
    o_s = i_s * BLOCK_S + tl.arange(0, BLOCK_S)
    o_d = tl.arange(0, BLOCK_D)
    m_s = o_s < S
    m_d = o_d < D
    p_kt = p_k + i_b * s_kb + o_s[:, None].to(tl.int64) * s_ks + o_d[None, :]
    # fp8 e4m3 -> q's dtype is exact (3 mantissa bits into 7 or 10); the scale stays fp32.
    b_k = tl.load(p_kt, mask=m_s[:, None] & m_d[None, :], other=0.0).to(p_q.dtype.element_ty)  # [BS, BD]
    b_scale = tl.load(p_scale + i_b * s_sb + o_s, mask=m_s, other=0.0)  # [BS]
    b_acc = tl.zeros([BLOCK_S], dtype=tl.float32)  # [BS]
    for h0 in range(0, H, BLOCK_H):
        o_h = h0 + tl.arange(0, BLOCK_H)
        m_h = o_h < H
        b_q = tl.load(p_q + i_b * s_qb + o_h[:, None] * s_qh + o_d[None, :],
                      mask=m_h[:, None] & m_d[None, :], other=0.0)  # [BH, BD]
        b_w = tl.load(p_w + i_b * s_wb + o_h, mask=m_h, other=0.0)  # [BH]
        b_logit = tl.dot(b_q, tl.trans(b_k)) * b_scale[None, :]  # [BH, BS] fp32
        b_acc += tl.sum(tl.maximum(b_logit, 0.0) * b_w[:, None], axis=0)
    tl.store(p_out + i_b * s_ob + o_s, b_acc, mask=m_s)


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
    if device.type == "cuda":
        return True
    # The interpreter runs fp16 dots correctly but not bf16 ones (it multiplies bit patterns).
    return _INTERPRETED and dtype != torch.bfloat16


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


def indexer_score_lowp(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Indexer scores on tensor cores in q's dtype with fp32 accumulation.

    q: [B, Hi, Di] bf16 (fp16 in interpreter tests); k: [B, S, Di] float8_e4m3fn;
    k_scale: [B, S] fp32; w: [B, Hi] fp32 -> scores [B, S] fp32.
    """
    B, H, D = q.shape
    S = k.shape[1]
    assert k.shape == (B, S, D) and k_scale.shape == (B, S) and w.shape == (B, H), "shape mismatch"
    if not _use_triton(q.device, q.dtype):
        return _indexer_score_emulated(q, k, k_scale, w)
    k = k if k.stride(-1) == 1 else k.contiguous()
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_scale = k_scale.float().contiguous()
    w = w.float().contiguous()
    out = torch.empty((B, S), device=q.device, dtype=torch.float32)
    if B == 0 or S == 0:
        return out.zero_()
    BLOCK_S = 64
    grid = (B, triton.cdiv(S, BLOCK_S))
    _indexer_score_mm_kernel[grid](
        q, k, k_scale, w, out, S,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k_scale.stride(0), w.stride(0), out.stride(0),
        H=H, D=D,
        BLOCK_S=BLOCK_S, BLOCK_H=min(64, _pow2(H)), BLOCK_D=_pow2(D),
    )
    return out


def _indexer_score_emulated(q, k, k_scale, w) -> torch.Tensor:
    """What the kernel computes, in torch: q and k exactly as the tensor cores see them, fp32 sums."""
    keys = k.to(q.dtype).float()  # [B, S, Di], exact
    logits = torch.bmm(q.float(), keys.transpose(1, 2)) * k_scale.float().unsqueeze(1)  # [B, Hi, S]
    return (torch.relu(logits) * w.float().unsqueeze(-1)).sum(dim=1)


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


def indexer_score(q, k, k_scale, w):
    """The `indexer_score` slot (dsv4opt.workload.impls): bf16 tensor cores, fp32 accumulation."""
    return indexer_score_lowp(q.to(torch.bfloat16), k, k_scale, w)


def hc_premix(x, weight):
    """The `hc_premix` slot (dsv4opt.workload.impls): bf16 tensor cores, fp32 accumulation."""
    return hc_premix_lowp(x, weight, torch.bfloat16)
