"""The lightning indexer's query kernel and SGLang's sm_120 torch path for its logits.

- `index_q_rope_hadamard_quant` stands for SGLang's `fused_q_indexer_rope_hadamard_quant` (jit
  main_norm_rope.cuh:433-551): per (token, index head), RoPE on the last rope dims, a Hadamard
  rotation, e4m3 with one fp32 scale, and the head weight times weight_scale times that scale.
- `index_logits_torch` is SGLang's `fp8_paged_mqa_logits_torch_sm120` (dsv4/indexer.py:155-216),
  forced on sm_120 by SGLANG_FP8_PAGED_MQA_LOGITS_TORCH: gather the request's key pages, dequantise
  the keys to fp32, fp32 `torch.bmm`, ReLU, weight, sum over heads, key scale, -inf past the end.
  It is the baseline `indexer_logits` slot, about 15 launches, one of them the FP32 SIMT GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from dsv4opt.tritonlib import interpreted, quantize_e4m3, runs_triton
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.kernels.compress import hadamard_row, rope_flat
from dsv4opt.workload.kvcache import AMAX_EPS, FP8, IndexKeyCache, quantize_index_key

AMAX_EPS_ = tl.constexpr(AMAX_EPS)


@triton.jit
def _index_q_kernel(p_q, p_w, p_cos, p_sin, p_pos, p_q8, p_wout, stride_q, stride_w, weight_scale,
                    H: tl.constexpr, N: tl.constexpr, DN: tl.constexpr, EMULATE: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    o_n = tl.arange(0, N)
    p_row = p_q + i_b * stride_q + i_h * N
    b_x = tl.load(p_row + o_n).to(tl.float32)
    b_xp = tl.load(p_row + (o_n ^ 1)).to(tl.float32)
    b_y = hadamard_row(rope_flat(b_x, b_xp, o_n, p_cos, p_sin, tl.load(p_pos + i_b), DN, (N - DN) // 2), o_n, N)
    b_q, b_s = quantize_e4m3(b_y, AMAX_EPS_, EMULATE)
    tl.store(p_q8 + (i_b * H + i_h) * N + o_n, b_q.to(p_q8.dtype.element_ty))
    b_w = tl.load(p_w + i_b * stride_w + i_h).to(tl.float32)
    tl.store(p_wout + i_b * H + i_h, b_w * weight_scale * b_s)


def index_q_rope_hadamard_quant(q: torch.Tensor, w: torch.Tensor, weight_scale: float, cos: torch.Tensor,
                                sin: torch.Tensor, pos: torch.Tensor, heads: int, rope: int):
    """q: [B, heads * dim] (model dtype), w: [B, heads] -> (q8 [B, heads, dim] e4m3, weights [B, heads] fp32)."""
    B = q.shape[0]
    dim = q.shape[1] // heads
    if not runs_triton(q):
        y = naive.hadamard(naive.rope(q.view(B, heads, dim).float(), cos, sin, pos))
        q8, s = quantize_index_key(y.reshape(B * heads, dim))
        return q8.view(B, heads, dim), w.float() * weight_scale * s.view(B, heads)
    assert q.stride(1) == 1 and w.stride(1) == 1
    q8 = torch.empty(B, heads, dim, device=q.device, dtype=FP8)
    wout = torch.empty(B, heads, device=q.device, dtype=torch.float32)
    if B:
        _index_q_kernel[(B, heads)](p_q=q, p_w=w, p_cos=cos, p_sin=sin, p_pos=pos, p_q8=q8, p_wout=wout,
                                    stride_q=q.stride(0), stride_w=w.stride(0), weight_scale=weight_scale,
                                    H=heads, N=dim, DN=dim - rope, EMULATE=interpreted(), num_warps=4)
    return q8, wout


def index_logits_torch(q8: torch.Tensor, weights: torch.Tensor, cache: IndexKeyCache, seq_lens: torch.Tensor,
                       page_table: torch.Tensor, max_len: int) -> torch.Tensor:
    """The baseline `indexer_logits` slot (contract in dsv4opt/workload/slots.py), SGLang's torch path.

    q8: [B, H, dim] e4m3; weights: [B, H] fp32; seq_lens: [B] entries each request has;
    page_table: [B, pages] rows of `cache.data`; max_len: logits width -> [B, max_len] fp32.
    """
    B, H, dim = q8.shape
    page = cache.page_size
    pages = -(-max_len // page)
    gathered = cache.data[page_table[:, :pages]]  # [B, pages, page bytes]
    values = gathered[..., : page * dim].contiguous().view(FP8).to(torch.float32).view(B, pages * page, dim)
    scales = gathered[..., page * dim :].contiguous().view(torch.float32).view(B, pages * page)
    score = torch.bmm(values, q8.to(torch.float32).transpose(1, 2))  # [B, S, H] fp32 (FP32 SIMT GEMM)
    score = F.relu(score)
    score = score * weights.unsqueeze(1)
    score = score.sum(dim=2)
    score = score * scales
    width = min(pages * page, max_len)
    logits = score.new_full((B, max_len), float("-inf"))
    logits[:, :width] = score[:, :width]
    positions = torch.arange(max_len, device=q8.device)
    logits.masked_fill_(positions.unsqueeze(0) >= seq_lens.unsqueeze(1), float("-inf"))
    return logits


@triton.jit
def sort_key(x):
    """fp32 -> uint32 in the same order (x not NaN): negatives inverted, non-negatives above them."""
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) == 1, ~bits, bits | 0x80000000)


@triton.jit
def _topk_transform_kernel(p_logits, p_len, p_base, p_out, stride_l, stride_o,
                           TOPK: tl.constexpr, K_P: tl.constexpr, BLOCK: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    n = tl.load(p_len + i_b)
    base = tl.load(p_base + i_b).to(tl.int32)
    o_k = tl.arange(0, K_P)
    p_row = p_logits + i_b * stride_l
    p_dst = p_out + i_b * stride_o
    if n <= TOPK:  # every entry, in order, then -1
        tl.store(p_dst + o_k, tl.where(o_k < n, base + o_k, -1), mask=o_k < TOPK)
    else:
        # Radix select: from the top bit down keep a bit set while at least TOPK of the request's
        # entries have keys at or above the prefix; it ends at the TOPK-th largest key. Every pass
        # reads the request's n entries only, not the row's S (SGLang's radix_topk loops to the
        # request's length, topk_v1.cuh:110-142): at the graph's width most of the row is unused.
        one = tl.full([], 1, tl.uint32)
        prefix = tl.full([], 0, tl.uint32)
        for bit in range(31, -1, -1):
            trial = prefix | (one << bit)
            count = tl.zeros([], tl.int32)
            for s0 in range(0, n, BLOCK):
                o_s = s0 + tl.arange(0, BLOCK)
                key = sort_key(tl.load(p_row + o_s, mask=o_s < n, other=float("-inf")))
                count += tl.sum(((key >= trial) & (o_s < n)).to(tl.int32), axis=0)
            prefix = tl.where(count >= TOPK, trial, prefix)
        # The entries above the threshold, then entries at it until TOPK are placed.
        placed = tl.zeros([], tl.int32)
        for s0 in range(0, n, BLOCK):
            o_s = s0 + tl.arange(0, BLOCK)
            key = sort_key(tl.load(p_row + o_s, mask=o_s < n, other=float("-inf")))
            take = (key > prefix) & (o_s < n)
            at = placed + tl.cumsum(take.to(tl.int32), axis=0) - 1
            tl.store(p_dst + at, base + o_s, mask=take)
            placed += tl.sum(take.to(tl.int32), axis=0)
        for s0 in range(0, n, BLOCK):
            o_s = s0 + tl.arange(0, BLOCK)
            key = sort_key(tl.load(p_row + o_s, mask=o_s < n, other=float("-inf")))
            tie = (key == prefix) & (o_s < n)
            at = placed + tl.cumsum(tie.to(tl.int32), axis=0) - 1
            tl.store(p_dst + at, base + o_s, mask=tie & (at < TOPK))
            placed += tl.sum(tie.to(tl.int32), axis=0)


def topk_transform(logits: torch.Tensor, seq_lens: torch.Tensor, base: torch.Tensor, topk: int) -> torch.Tensor:
    """Entry numbers (offset by base [B], the request's first entry) of the top-`topk` logits of
    each request's first seq_lens[b] entries, in one launch; all of them in order when
    seq_lens <= topk, -1 after. [B, topk] int32; entries that exist come first.

    Stands for SGLang's JIT `topk_transform_512` (jit topk_v1.cuh: one block per request, radix
    top-k, then page translation; our caches' pages are each request's own, so the translation is
    the offset).
    """
    if not runs_triton(logits):
        return select_topk(logits, seq_lens, base, topk)
    B, S = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    out = torch.empty(B, topk, device=logits.device, dtype=torch.int32)
    if B:
        _topk_transform_kernel[(B,)](p_logits=logits, p_len=seq_lens, p_base=base, p_out=out,
                                     stride_l=logits.stride(0), stride_o=out.stride(0), TOPK=topk,
                                     K_P=triton.next_power_of_2(topk), BLOCK=min(1024, triton.next_power_of_2(S)),
                                     num_warps=8)
    return out


def select_topk(logits: torch.Tensor, seq_lens: torch.Tensor, base: torch.Tensor, topk: int) -> torch.Tensor:
    """Entry numbers of the top-`topk` logits of each request (all of them when seq_lens <= topk),
    offset by base [B] (the request's first entry in the cache); -1 pads. [B, topk] int32.
    Logits past seq_lens[b] are -inf (the indexer logits' contract).

    The plain-torch path of `topk_transform`.
    """
    k = min(topk, logits.shape[1])
    # sorted, so the entries that exist come first: attention reads only the first `lengths` slots
    top = logits.topk(k, dim=1, sorted=True)
    idx = torch.where(torch.isfinite(top.values), base[:, None] + top.indices, -1)
    if k < topk:
        idx = F.pad(idx, (0, topk - k), value=-1)
    return idx.int()
