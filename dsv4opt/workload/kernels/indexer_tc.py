"""The indexer's logits on tensor cores, reading the paged e4m3 keys where they lie.

One kernel, two operand types:

- `fp8`: the stand-in for DeepGEMM's `fp8_paged_mqa_logits`, what SGLang 0.5.23 runs on Hopper
  (sglang/srt/layers/attention/dsv4/indexer.py; DeepGEMM compiles its kernels with nvcc at run time,
  so it cannot run where this tool runs): e4m3 queries times e4m3 keys on FP8 tensor cores, fp32
  accumulation.
- `bf16`: bf16-gemm's replacement for the sm_120 path's float32 `torch.bmm`: the same e4m3 values
  converted to bf16 first (exact: 3 mantissa bits into 7).

Either way ReLU, the head weights, the head sum and the key scale are applied to the fp32 dot
products in registers (a bf16 `torch.bmm` would round every head's logit to 8 bits before the ReLU,
which is where top-k swaps come from). Products of e4m3 values are exact in both, so the two agree
to fp32 summation order. Maths and byte counts: docs/optimizations/bf16_gemm.md.

On CUDA the Triton kernel runs; on a CPU under the interpreter it runs with fp16 operands (exact
for e4m3 values; the interpreter cannot multiply bf16), elsewhere on a CPU a torch emulation
computes the same thing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import interpreted, runs_triton

OPERANDS = ("fp8", "bf16")
_FP16, _BF16, _FP8 = 0, 1, 2  # the kernel's OPERAND: what the e4m3 values are multiplied as


@triton.jit
def operand(x, OPERAND: tl.constexpr):
    """e4m3 values as the tensor core multiplies them: kept (FP8 MMA), or converted exactly."""
    if OPERAND == 0:
        x = x.to(tl.float16)
    elif OPERAND == 1:
        x = x.to(tl.bfloat16)
    return x


@triton.jit
def score_tile(p_q, p_w, p_keys, p_scales, p_pages, i_b, o_s, n,
               stride_qb, stride_qh, stride_wb, stride_pb, page_size, page_bytes,
               H: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
               OPERAND: tl.constexpr):
    """Scores of entries o_s [BS] of request i_b; -inf at o_s >= n, where nothing is read (the logits
    kernel here and indexer-topk's fused one share it)."""
    o_d = tl.arange(0, D_P)
    m_d = o_d < D
    m_s = o_s < n
    page = tl.load(p_pages + i_b * stride_pb + o_s // page_size, mask=m_s, other=0).to(tl.int64)
    slot = (o_s % page_size).to(tl.int64)
    at = page * page_bytes + slot * D  # [BS] first byte of each entry's key
    b_k = operand(tl.load(p_keys + at[:, None] + o_d[None, :], mask=m_s[:, None] & m_d[None, :], other=0.0),
                  OPERAND)  # [BS, D_P]
    b_scale = tl.load(p_scales + (page * page_bytes + page_size * D) // 4 + slot, mask=m_s, other=0.0)  # [BS]
    b_acc = tl.zeros([BLOCK_S], dtype=tl.float32)  # [BS]
    for h0 in range(0, H, BLOCK_H):
        o_h = h0 + tl.arange(0, BLOCK_H)
        m_h = o_h < H
        b_q = tl.load(p_q + i_b * stride_qb + o_h[:, None] * stride_qh + o_d[None, :],
                      mask=m_h[:, None] & m_d[None, :], other=0.0)  # [BH, D_P]
        b_q = operand(b_q, OPERAND)
        b_w = tl.load(p_w + i_b * stride_wb + o_h, mask=m_h, other=0.0)  # [BH]
        b_dot = tl.dot(b_q, tl.trans(b_k))  # [BH, BS] fp32: products of e4m3 values are exact
        b_acc += tl.sum(tl.maximum(b_dot, 0.0) * b_w[:, None], axis=0)
    return tl.where(m_s, b_acc * b_scale, float("-inf"))


@triton.jit
def _indexer_logits_kernel(
    p_q, p_w, p_keys, p_scales, p_len, p_pages, p_out,
    stride_qb, stride_qh, stride_wb, stride_pb, stride_ob, page_size, page_bytes, max_len,
    H: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    OPERAND: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    i_s = tl.program_id(1)
    o_s = i_s * BLOCK_S + tl.arange(0, BLOCK_S)
    n = tl.load(p_len + i_b)
    m_s = o_s < max_len
    if i_s * BLOCK_S >= n:
        # Past the request's entries: at SGLang's graph width that is most of the row, so write
        # the -inf the contract asks for and read nothing.
        tl.store(p_out + i_b * stride_ob + o_s, tl.full([BLOCK_S], float("-inf"), tl.float32), mask=m_s)
        return
    b_out = score_tile(p_q, p_w, p_keys, p_scales, p_pages, i_b, o_s, n, stride_qb, stride_qh, stride_wb, stride_pb,
                       page_size, page_bytes, H, D, D_P, BLOCK_S, BLOCK_H, OPERAND)
    tl.store(p_out + i_b * stride_ob + o_s, b_out, mask=m_s)


def index_logits_tc(q8: torch.Tensor, weights: torch.Tensor, cache, seq_lens: torch.Tensor,
                    page_table: torch.Tensor, max_len: int, operands: str = "fp8") -> torch.Tensor:
    """The `indexer_logits` slot (dsv4opt/workload/slots.py) in one kernel on `operands` tensor cores.

    Reads the paged e4m3 keys where they lie (no gather, no fp32 copy), multiplies them with the
    e4m3 queries on tensor cores (exact products, fp32 accumulation) and applies ReLU, head weights,
    the head sum and the key scale in registers. Same contract as the sm_120 path's torch fallback.
    """
    assert operands in OPERANDS, operands
    B, H, D = q8.shape
    if not runs_triton(q8):
        return _indexer_logits_emulated(q8, weights, cache, seq_lens, page_table, max_len)
    assert q8.stride(2) == 1
    out = torch.empty(B, max_len, device=q8.device, dtype=torch.float32)
    raw = cache.data.view(-1)
    BLOCK_S = 64
    if B:
        _indexer_logits_kernel[(B, triton.cdiv(max_len, BLOCK_S))](
            p_q=q8, p_w=weights, p_keys=raw.view(torch.float8_e4m3fn), p_scales=raw.view(torch.float32),
            p_len=seq_lens, p_pages=page_table, p_out=out, stride_qb=q8.stride(0), stride_qh=q8.stride(1),
            stride_wb=weights.stride(0), stride_pb=page_table.stride(0), stride_ob=out.stride(0),
            page_size=cache.page_size, page_bytes=cache.page_bytes, max_len=max_len,
            H=H, D=D, D_P=_pow2(D), BLOCK_S=BLOCK_S, BLOCK_H=min(64, _pow2(H)),
            OPERAND=_FP16 if interpreted() else _FP8 if operands == "fp8" else _BF16,
            num_warps=4,
        )
    return out


def _indexer_logits_emulated(q8, weights, cache, seq_lens, page_table, max_len) -> torch.Tensor:
    """What the kernel computes, in torch (CPU without the interpreter): exact e4m3 products, fp32 sums."""
    B, H, D = q8.shape
    s = torch.arange(max_len, device=q8.device)
    entries = (page_table.long()[:, s // cache.page_size] * cache.page_size + s % cache.page_size).reshape(-1)
    keys, scales = cache.read(entries, torch.float32)
    dots = torch.bmm(q8.float(), keys.view(B, max_len, D).transpose(1, 2)).clamp(min=0)  # [B, H, S]
    logits = (dots * weights.float()[:, :, None]).sum(1) * scales.view(B, max_len)
    return logits.masked_fill(s[None, :] >= seq_lens[:, None], float("-inf"))


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))
