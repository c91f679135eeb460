"""indexer-topk's kernels: the indexer's scores over each request's own entries, and their top-k.

Both modes score only the entries s < seq_lens[b] (the page table's width never reaches a grid, a
store or a read) and skip the scores of a request with at most top-k entries, which keeps them all
whatever they score. Scores go to a scratch row [B, width] fp32 of which only the valid entries
are written, and are read back by the same launch (fused) or the next (split); either way the row
is a request's 4 bytes an entry, written and read once, mostly from L2. Maths, bytes and launches:
docs/optimizations/indexer-topk.md.

- `fused`: one program per request computes its scores tile by tile into its row, then selects.
  One launch a layer; a request's work on one SM.
- `split`: (B, splits) programs score a request's tiles between them, then one program per
  request selects. Two launches; the scoring spread over the GPU at small batch and long context.

The score of an entry is the `indexer_logits` slot's (e4m3 q and keys, exact products, fp32
accumulation on FP8 tensor cores, ReLU, head weights, head sum, key scale), computed tile for tile
as the Hopper path's stand-in (workload/kernels/indexer_tc.py) computes it. The selection is a
radix select on the scores' order-preserving uint32 keys, 8 bits a pass (a 256-bin histogram of
the entries still in play), then the entries above the k-th key in order, then the entries equal to
it in order until k are placed: the set and order `topk_transform` writes, in 6 passes over the row
instead of its 34.

On CUDA the Triton kernels run; under the interpreter they run with fp16 operands (exact for e4m3
values; the interpreter cannot multiply bf16); elsewhere on a CPU a torch path computes the same
scores and selection.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import compile_only, interpreted, runs_triton, sm_count
from dsv4opt.workload.kernels.indexer import select_topk, sort_key
from dsv4opt.workload.kernels.indexer_tc import score_tile

MODES = ("auto", "fused", "split")
OPERANDS = ("fp8", "bf16")
_FP16, _BF16, _FP8 = 0, 1, 2  # what the e4m3 values are multiplied as (the kernels' OPERAND)
BLOCK_S = 64  # entries a scoring tile (SGLang's index page, DeepGEMM's BLOCK_KV)
RADIX_BITS = 8  # bits of the key a selection pass settles: 4 passes and a 256-bin histogram
SELECT_BLOCK = 1024  # entries a selection step reads
INTERPRETER_SPLITS = 3  # programs a request under the interpreter (no SMs to count)




@triton.jit
def _select_row(p_row, p_dst, n, base, TOPK: tl.constexpr, K_P: tl.constexpr, BLOCK: tl.constexpr,
                RADIX_BITS: tl.constexpr):
    """Write base + s of the top-TOPK of p_row[:n] to p_dst[:TOPK] (all s < n in order, -1 after,
    when n <= TOPK). Reads nothing at or past n."""
    o_k = tl.arange(0, K_P)
    if n <= TOPK:
        tl.store(p_dst + o_k, tl.where(o_k < n, base + o_k, -1), mask=o_k < TOPK)
    else:
        NBINS: tl.constexpr = 1 << RADIX_BITS
        o_d = tl.arange(0, NBINS)
        # The TOPK-th largest key, RADIX_BITS at a time from the top: among the entries whose key
        # matches the bits settled so far, a histogram of the next digit, and the highest digit
        # with at least `need` entries at or above it.
        prefix = tl.full([], 0, tl.uint32)
        settled = tl.full([], 0, tl.uint32)
        need = tl.full([], TOPK, tl.int32)  # entries still to take at or below the prefix
        for i in tl.static_range(32 // RADIX_BITS):
            shift = 32 - RADIX_BITS * (i + 1)
            b_hist = tl.zeros([NBINS], dtype=tl.int32)  # [NB]
            for s0 in range(0, n, BLOCK):
                o_s = s0 + tl.arange(0, BLOCK)
                m_s = o_s < n
                key = sort_key(tl.load(p_row + o_s, mask=m_s, other=float("-inf")))
                digit = ((key >> shift) & (NBINS - 1)).to(tl.int32)
                b_hist += tl.histogram(digit, NBINS, mask=m_s & ((key & settled) == prefix))
            at_or_above = tl.cumsum(b_hist, 0, reverse=True)  # [NB]
            d = tl.max(tl.where(at_or_above >= need, o_d, -1), 0)
            need -= tl.sum(tl.where(o_d > d, b_hist, 0), 0)
            prefix = prefix | (d.to(tl.uint32) << shift)
            settled = settled | tl.full([], (NBINS - 1) << shift, tl.uint32)
        # The entries above the k-th key, in order, then those at it, in order, until TOPK are placed.
        placed = tl.zeros([], tl.int32)
        for s0 in range(0, n, BLOCK):
            o_s = s0 + tl.arange(0, BLOCK)
            m_s = o_s < n
            key = sort_key(tl.load(p_row + o_s, mask=m_s, other=float("-inf")))
            take = (key > prefix) & m_s
            at = placed + tl.cumsum(take.to(tl.int32), 0) - 1
            tl.store(p_dst + at, base + o_s, mask=take)
            placed += tl.sum(take.to(tl.int32), 0)
        for s0 in range(0, n, BLOCK):
            o_s = s0 + tl.arange(0, BLOCK)
            m_s = o_s < n
            key = sort_key(tl.load(p_row + o_s, mask=m_s, other=float("-inf")))
            tie = (key == prefix) & m_s
            at = placed + tl.cumsum(tie.to(tl.int32), 0) - 1
            tl.store(p_dst + at, base + o_s, mask=tie & (at < TOPK))
            placed += tl.sum(tie.to(tl.int32), 0)


@triton.jit
def _fused_kernel(
    p_q, p_w, p_keys, p_scales, p_len, p_pages, p_base, p_rows, p_out,
    stride_qb, stride_qh, stride_wb, stride_pb, stride_rb, stride_ob, page_size, page_bytes,
    H: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    TOPK: tl.constexpr, K_P: tl.constexpr, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr, OPERAND: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    n = tl.load(p_len + i_b)
    base = tl.load(p_base + i_b)
    p_row = p_rows + i_b * stride_rb
    if n > TOPK:  # with fewer entries every one is kept, whatever it scores
        for s0 in range(0, n, BLOCK_S):
            o_s = s0 + tl.arange(0, BLOCK_S)
            b_score = score_tile(p_q, p_w, p_keys, p_scales, p_pages, i_b, o_s, n, stride_qb, stride_qh,
                                  stride_wb, stride_pb, page_size, page_bytes, H, D, D_P, BLOCK_S, BLOCK_H, OPERAND)
            tl.store(p_row + o_s, b_score, mask=o_s < n)
        tl.debug_barrier()  # the row's stores, by every thread of the program, before any reads it
    _select_row(p_row, p_out + i_b * stride_ob, n, base, TOPK, K_P, BLOCK, RADIX_BITS)


@triton.jit
def _score_split_kernel(
    p_q, p_w, p_keys, p_scales, p_len, p_pages, p_rows,
    stride_qb, stride_qh, stride_wb, stride_pb, stride_rb, page_size, page_bytes, splits,
    H: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    TOPK: tl.constexpr, OPERAND: tl.constexpr,
):
    i_b = tl.program_id(0).to(tl.int64)
    i_p = tl.program_id(1)
    n = tl.load(p_len + i_b)
    if n > TOPK:
        for t in range(i_p, tl.cdiv(n, BLOCK_S), splits):  # tiles dealt round the request's programs
            o_s = t * BLOCK_S + tl.arange(0, BLOCK_S)
            b_score = score_tile(p_q, p_w, p_keys, p_scales, p_pages, i_b, o_s, n, stride_qb, stride_qh,
                                  stride_wb, stride_pb, page_size, page_bytes, H, D, D_P, BLOCK_S, BLOCK_H, OPERAND)
            tl.store(p_rows + i_b * stride_rb + o_s, b_score, mask=o_s < n)


@triton.jit
def _select_kernel(p_rows, p_len, p_base, p_out, stride_rb, stride_ob,
                   TOPK: tl.constexpr, K_P: tl.constexpr, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    _select_row(p_rows + i_b * stride_rb, p_out + i_b * stride_ob, tl.load(p_len + i_b), tl.load(p_base + i_b),
                TOPK, K_P, BLOCK, RADIX_BITS)


def choose_mode(batch: int, device: torch.device) -> str:
    """`auto`'s choice: fused when the batch alone gives every other SM a request (each program then
    works through its own request's tiles), else split. Until measured (docs: "Not measured on a GPU
    yet"), this rule is a guess that `dsv4opt bench indexer-topk` times against both modes."""
    if device.type != "cuda" and not compile_only():
        return "fused"
    return "fused" if 2 * batch >= sm_count(device) else "split"


def score_splits(batch: int, width: int, device: torch.device) -> int:
    """Programs a request's scoring is dealt to in split mode: about two programs an SM over the
    batch, no more than the widest row has tiles."""
    if device.type != "cuda" and not compile_only():
        target = INTERPRETER_SPLITS
    else:
        target = triton.cdiv(2 * sm_count(device), max(batch, 1))
    return max(1, min(target, triton.cdiv(width, BLOCK_S)))


def indexer_topk(q8: torch.Tensor, weights: torch.Tensor, cache, seq_lens: torch.Tensor, page_table: torch.Tensor,
                 base: torch.Tensor, topk: int, logits=None, *, mode: str = "auto", operands: str = "fp8",
                 splits: int | None = None) -> torch.Tensor:
    """The `indexer_topk` slot (dsv4opt/workload/slots.py) over each request's own entries only.

    q8: [B, H, D] e4m3; weights: [B, H] fp32; cache: IndexKeyCache; seq_lens: [B] int32;
    page_table: [B, P] int32; base: [B] int32 -> [B, topk] int32. `logits` (the step's indexer_logits
    implementation) is not called: the scores are this function's own. `mode`: fused, split or auto
    (choose_mode); `operands`: what the e4m3 values are multiplied as on a GPU (FP8 tensor cores, or
    bf16 after an exact conversion); `splits`: split mode's programs a request (score_splits).
    """
    assert mode in MODES and operands in OPERANDS, (mode, operands)
    B, H, D = q8.shape
    width = page_table.shape[1] * cache.page_size
    if not runs_triton(q8):
        return _indexer_topk_torch(q8, weights, cache, seq_lens, page_table, base, topk)
    assert q8.stride(2) == 1 and weights.stride(1) == 1 and page_table.stride(1) == 1
    out = torch.empty(B, topk, device=q8.device, dtype=torch.int32)
    if B == 0:
        return out
    rows = torch.empty(B, width, device=q8.device, dtype=torch.float32)  # only entries s < seq_lens[b] written
    raw = cache.data.view(-1)
    mode = choose_mode(B, q8.device) if mode == "auto" else mode
    operand = _FP16 if interpreted() else _FP8 if operands == "fp8" else _BF16
    score = dict(p_q=q8, p_w=weights, p_keys=raw.view(torch.float8_e4m3fn), p_scales=raw.view(torch.float32),
                 p_len=seq_lens, p_pages=page_table, p_rows=rows, stride_qb=q8.stride(0), stride_qh=q8.stride(1),
                 stride_wb=weights.stride(0), stride_pb=page_table.stride(0), stride_rb=rows.stride(0),
                 page_size=cache.page_size, page_bytes=cache.page_bytes, H=H, D=D, D_P=_pow2(D), BLOCK_S=BLOCK_S,
                 BLOCK_H=min(64, _pow2(H)), OPERAND=operand)
    select = dict(TOPK=topk, K_P=triton.next_power_of_2(topk), BLOCK=min(SELECT_BLOCK, _pow2(width)),
                  RADIX_BITS=RADIX_BITS)
    if mode == "fused":
        _fused_kernel[(B,)](**score, p_base=base, p_out=out, stride_ob=out.stride(0), **select, num_warps=8)
    else:
        n_split = splits or score_splits(B, width, q8.device)
        _score_split_kernel[(B, n_split)](**score, splits=n_split, TOPK=topk, num_warps=4)
        _select_kernel[(B,)](p_rows=rows, p_len=seq_lens, p_base=base, p_out=out, stride_rb=rows.stride(0),
                             stride_ob=out.stride(0), **select, num_warps=8)
    return out


def index_scores(q8: torch.Tensor, weights: torch.Tensor, cache, seq_lens: torch.Tensor,
                 page_table: torch.Tensor) -> torch.Tensor:
    """The scores the kernels select from, [B, width] fp32 (split mode's scoring launch with no
    request skipped; -inf past seq_lens[b]): for the gate, which judges them against float64."""
    B, H, D = q8.shape
    width = page_table.shape[1] * cache.page_size
    if not runs_triton(q8):
        return _scores_torch(q8, weights, cache, seq_lens, page_table)
    rows = torch.full((B, width), float("-inf"), device=q8.device, dtype=torch.float32)
    if B:
        raw = cache.data.view(-1)
        n_split = score_splits(B, width, q8.device)
        _score_split_kernel[(B, n_split)](
            p_q=q8, p_w=weights, p_keys=raw.view(torch.float8_e4m3fn), p_scales=raw.view(torch.float32),
            p_len=seq_lens, p_pages=page_table, p_rows=rows, stride_qb=q8.stride(0), stride_qh=q8.stride(1),
            stride_wb=weights.stride(0), stride_pb=page_table.stride(0), stride_rb=rows.stride(0),
            page_size=cache.page_size, page_bytes=cache.page_bytes, splits=n_split, H=H, D=D, D_P=_pow2(D),
            BLOCK_S=BLOCK_S, BLOCK_H=min(64, _pow2(H)), TOPK=-1, OPERAND=_FP16 if interpreted() else _FP8,
            num_warps=4)
    return rows


def _scores_torch(q8, weights, cache, seq_lens, page_table) -> torch.Tensor:
    """The kernels' scores in torch (a CPU without the interpreter): exact e4m3 products, fp32 sums."""
    B, H, D = q8.shape
    width = page_table.shape[1] * cache.page_size
    s = torch.arange(width, device=q8.device)
    entries = (page_table.long()[:, s // cache.page_size] * cache.page_size + s % cache.page_size).reshape(-1)
    keys, scales = cache.read(entries, torch.float32)
    dots = torch.bmm(q8.float(), keys.view(B, width, D).transpose(1, 2)).clamp(min=0)  # [B, H, S]
    scores = (dots * weights.float()[:, :, None]).sum(1) * scales.view(B, width)
    return scores.masked_fill(s[None, :] >= seq_lens[:, None], float("-inf"))


def _indexer_topk_torch(q8, weights, cache, seq_lens, page_table, base, topk) -> torch.Tensor:
    return select_topk(_scores_torch(q8, weights, cache, seq_lens, page_table), seq_lens, base, topk)


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))
