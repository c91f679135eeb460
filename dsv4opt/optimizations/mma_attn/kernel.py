"""Tensor-core sparse-MLA decode: a tile of heads shares each KV tile, split-K with an LSE combine.

Maths, byte/FLOP accounting and tile choice: docs/kernels/mma_attn.md.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from dsv4opt.errors import DsvOptError
from dsv4opt.tritonlib import LN2, LOG2E
from dsv4opt.workload.attention.simt import check_attention_inputs
from dsv4opt.workload.kvcache import KVCache

# Running max before any used slot: finite, so exp2(m_old - m_new) never evaluates inf - inf.
_NO_SCORE = tl.constexpr(-1.0e30)
LOG2E_ = tl.constexpr(LOG2E)
LN2_ = tl.constexpr(LN2)


@triton.jit
def _load_latent_cols(p_kv, p_kv8, p_kvu8, p_kv16, tok, m_row, o_c, stride_kv, page_size, page_bytes,
                      DN: tl.constexpr, D: tl.constexpr, FP8: tl.constexpr, TILE: tl.constexpr,
                      DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr):
    """Columns o_c of the latent rows of tokens `tok` (masked rows read nothing and give 0), in q's
    dtype. FP8 layout (whole rows only, rope one tile wide): the row as tiles of TILE columns, the
    nope tiles e4m3 times their UE8M0 scale, the last one the bf16 rope; dequantised in registers."""
    if FP8:
        NT: tl.constexpr = o_c.shape[0] // TILE  # tiles in the padded row
        NOPE_TILES: tl.constexpr = DN // TILE
        page = tok // page_size
        slot = tok % page_size
        at = page * page_bytes + slot * DATA_BYTES  # [BK] first byte of each token's record
        at_s = page * page_bytes + page_size * DATA_BYTES + slot * SCALE_BYTES
        o_t = tl.arange(0, NT)
        o_e = tl.arange(0, TILE)
        col = o_t[:, None] * TILE + o_e[None, :]  # [NT, TILE]
        m_t = m_row[:, None] & (o_t < NOPE_TILES)[None, :]  # [BK, NT]
        b_nope = tl.load(p_kv8 + at[:, None, None] + col[None, :, :], mask=m_t[:, :, None], other=0.0)  # [BK, NT, TILE]
        b_e = tl.load(p_kvu8 + at_s[:, None] + o_t[None, :], mask=m_t, other=127).to(tl.float32)  # [BK, NT]
        b_rope = tl.load(p_kv16 + ((at + DN) // 2)[:, None] + o_e[None, :], mask=m_row[:, None], other=0.0)  # [BK, TILE]
        b_x = tl.where((o_t == NOPE_TILES)[None, :, None], b_rope.to(tl.float32)[:, None, :],
                       b_nope.to(tl.float32) * tl.exp2(b_e - 127.0)[:, :, None])  # [BK, NT, TILE]
        b_x = tl.reshape(b_x, [tok.shape[0], NT * TILE]).to(p_kv.dtype.element_ty)
    else:
        b_x = tl.load(p_kv + tok[:, None] * stride_kv + o_c[None, :], mask=m_row[:, None] & (o_c[None, :] < D), other=0.0)
    return b_x


@triton.jit
def _mma_sparse_decode_kernel(
    p_q, p_kv, p_kv8, p_kvu8, p_kv16, p_idx, p_len, p_sink, p_o, p_lse, p_o_part, p_lse_part,
    stride_qb, stride_qh, stride_kv, stride_ib, stride_ob, stride_oh,
    H, qk_scale_log2, page_size, page_bytes,
    K: tl.constexpr, CHUNK: tl.constexpr, SPLIT_BASE: tl.constexpr, NS_TOTAL: tl.constexpr,
    DN: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
    FP8: tl.constexpr, TILE: tl.constexpr, DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr,
    BH: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, RELOAD_V: tl.constexpr,
):
    """One program: request i_b, heads [i_h*BH, +BH), value columns [i_v*BV, +BV), selected
    slots [i_s*CHUNK, +CHUNK) of one cache.

    Scores always use the whole latent row; with BV < D_P the value columns are split over
    programs (smaller accumulator, more programs per SM; the rows they share come from L2).
    NS_TOTAL == 1 (one cache, one split) writes o and lse directly, sink included; otherwise fp32
    partials (o normalised by its own denominator, base-2 lse) into split SPLIT_BASE + i_s of
    NS_TOTAL, which _attn_combine_splits_kernel merges with the sink.
    """
    NV: tl.constexpr = D_P // BV
    i_b = tl.program_id(0)
    i_h = tl.program_id(1) // NV
    i_v = tl.program_id(1) % NV
    i_s = tl.program_id(2)
    o_h = i_h * BH + tl.arange(0, BH)
    m_h = o_h < H
    o_d = tl.arange(0, D_P)
    m_d = o_d < D
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < D
    p_q_tile = p_q + i_b * stride_qb + o_h[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q_tile, mask=m_h[:, None] & m_d[None, :], other=0.0)  # [BH, D_P]
    n_used = tl.load(p_len + i_b)

    b_m = tl.full([BH], _NO_SCORE, tl.float32)  # [BH] running max, base 2
    b_l = tl.zeros([BH], tl.float32)  # [BH]
    b_acc = tl.zeros([BH, BV], tl.float32)  # [BH, BV]
    # Compile-time loop bounds (the interpreter cannot loop to a run-time scalar); slots past the
    # context or marked -1 are masked, so their rows are never read.
    for k0 in range(0, CHUNK, BK):
        o_k = i_s * CHUNK + k0 + tl.arange(0, BK)
        m_k = (o_k < K) & (o_k < n_used)
        b_idx = tl.load(p_idx + i_b * stride_ib + o_k, mask=m_k, other=-1)  # [BK]
        m_row = b_idx >= 0
        tok = tl.where(m_row, b_idx, 0).to(tl.int64)  # caches can exceed 2^31 bytes
        b_k = _load_latent_cols(p_kv, p_kv8, p_kvu8, p_kv16, tok, m_row, o_d, stride_kv, page_size, page_bytes,
                                DN, D, FP8, TILE, DATA_BYTES, SCALE_BYTES)  # [BK, D_P]
        if RELOAD_V or NV > 1:
            # A second load of the same rows (L1/L2 hits): each load then feeds one MMA only.
            b_v = _load_latent_cols(p_kv, p_kv8, p_kvu8, p_kv16, tok, m_row, o_v, stride_kv, page_size, page_bytes,
                                    DN, D, FP8, TILE, DATA_BYTES, SCALE_BYTES)  # [BK, BV]
        else:
            b_v = b_k
        b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale_log2  # [BH, BK]
        b_s = tl.where(m_row[None, :], b_s, float("-inf"))
        b_m_new = tl.maximum(b_m, tl.max(b_s, axis=1))  # [BH]
        b_alpha = tl.exp2(b_m - b_m_new)  # [BH]
        b_p = tl.exp2(b_s - b_m_new[:, None])  # [BH, BK]
        b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
        b_acc = tl.dot(b_p.to(b_v.dtype), b_v, acc=b_acc * b_alpha[:, None])  # [BH, BV]
        b_m = b_m_new

    m_o = m_h[:, None] & m_v[None, :]
    # every value slice computes the same lse; one writes it (a tensor compare: a scalar one makes
    # an int32 mask, which Triton 3.9's interpreter refuses)
    m_lse = m_h & ((o_h * 0 + i_v) == 0)
    if NS_TOTAL == 1:
        b_sink = tl.load(p_sink + o_h, mask=m_h, other=0.0).to(tl.float32) * LOG2E_
        b_top = tl.maximum(b_m, b_sink)  # [BH]
        b_w = tl.exp2(b_m - b_top)
        b_den = b_l * b_w + tl.exp2(b_sink - b_top)
        b_o = b_acc * (b_w / b_den)[:, None]
        p_o_tile = p_o + i_b * stride_ob + o_h[:, None] * stride_oh + o_v[None, :]
        tl.store(p_o_tile, b_o.to(p_o.dtype.element_ty), mask=m_o)
        tl.store(p_lse + i_b * H + o_h, (b_top + tl.log2(b_den)) * LN2_, mask=m_lse)
    else:
        m_any = b_l > 0
        b_o = b_acc / tl.where(m_any, b_l, 1.0)[:, None]
        b_lse2 = tl.where(m_any, b_m + tl.log2(tl.where(m_any, b_l, 1.0)), float("-inf"))
        row_part = (i_b * NS_TOTAL + SPLIT_BASE + i_s).to(tl.int64) * H + o_h  # [BH] rows of [B*NS_TOTAL*H]
        tl.store(p_o_part + row_part[:, None] * D + o_v[None, :], b_o, mask=m_o)
        tl.store(p_lse_part + row_part, b_lse2, mask=m_lse)


@triton.jit
def _attn_combine_splits_kernel(
    p_o_part, p_lse_part, p_sink, p_o, p_lse,
    stride_ob, stride_oh, H,
    NSPLIT: tl.constexpr, NS_P: tl.constexpr, D: tl.constexpr, D_P: tl.constexpr,
):
    """One program per (request, head): merge the NSPLIT partials and the sink."""
    i_b = tl.program_id(0)
    i_h = tl.program_id(1)
    o_s = tl.arange(0, NS_P)
    m_s = o_s < NSPLIT
    o_d = tl.arange(0, D_P)
    m_d = o_d < D
    row_part = (i_b * NSPLIT + o_s).to(tl.int64) * H + i_h  # [NS_P]
    b_lse2 = tl.load(p_lse_part + row_part, mask=m_s, other=float("-inf"))  # [NS_P]
    b_sink = tl.load(p_sink + i_h).to(tl.float32) * LOG2E_
    b_top = tl.maximum(tl.max(b_lse2, axis=0), b_sink)
    b_w = tl.exp2(b_lse2 - b_top)  # [NS_P], 0 for empty splits
    b_den = tl.sum(b_w, axis=0) + tl.exp2(b_sink - b_top)
    b_part = tl.load(p_o_part + row_part[:, None] * D + o_d[None, :], mask=m_s[:, None] & m_d[None, :], other=0.0)
    b_o = tl.sum(b_part * b_w[:, None], axis=0) / b_den  # [D_P]
    tl.store(p_o + i_b * stride_ob + i_h * stride_oh + o_d, b_o.to(p_o.dtype.element_ty), mask=m_d)
    tl.store(p_lse + i_b * H + i_h, (b_top + tl.log2(b_den)) * LN2_)


# Triton chose interpreter or compiler when the kernels above were defined.
_INTERPRETED = type(_mma_sparse_decode_kernel).__name__ == "InterpretedFunction"


@dataclass(frozen=True)
class Tiles:
    """Launch configuration; `nsplit` programs share each (request, head tile)."""

    block_h: int
    block_k: int
    nsplit: int
    num_warps: int
    num_stages: int
    block_v: int = 0  # value columns per program; 0 = the whole latent
    reload_v: bool = False  # load the rows again for the PV product instead of reusing them


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Tile families measured best on the H200 (docs/kernels/mma_attn.md); scripts/gpu_mma_attn.py
# sweeps them. From B = 16 up the whole-width family wins; at small B, splitting the value columns
# over programs gives a tiny problem four times the programs (QK is recomputed per slice).
TILE_DEFAULTS = {"block_k": 64, "num_warps": 8, "num_stages": 2, "block_v": 0, "reload_v": False, "split_factor": 1.0}
SMALL_BATCH_TILES = {"block_k": 32, "num_warps": 4, "num_stages": 4, "block_v": 128, "reload_v": True, "split_factor": 1.0}
SMALL_BATCH_MAX = 4
# Two masked loads per tile (separate nope and rope) double the staging buffers: 64-row tiles
# then need 262 KB of shared memory, past the H200's 227 KB.
_SPLIT_KV_MAX_BLOCK_K = 32


def choose_tiles(batch: int, heads: int, topk: int, device: torch.device, dim: int = 512) -> Tiles:
    """Tiles from B, H and K: 64-head tiles (Hopper's MMA wants 64 rows), then split the selected
    slots until about `split_factor` programs per SM; at large B a single pass needs no partials."""
    d = SMALL_BATCH_TILES if batch <= SMALL_BATCH_MAX else TILE_DEFAULTS
    block_h = min(64, max(16, triton.next_power_of_2(heads)))
    d_p = triton.next_power_of_2(dim)
    block_v = d["block_v"] if d["block_v"] and d_p % d["block_v"] == 0 else 0
    sms = _sm_count(device.index or 0) if device.type == "cuda" else 132
    programs = batch * triton.cdiv(heads, block_h) * (d_p // block_v if block_v else 1)
    nsplit = max(1, min(round(d["split_factor"] * sms / programs), triton.cdiv(topk, d["block_k"])))
    return Tiles(
        block_h=block_h, block_k=d["block_k"], nsplit=nsplit, num_warps=d["num_warps"],
        num_stages=d["num_stages"], block_v=block_v, reload_v=d["reload_v"],
    )


def split_chunks(topk: int, block_k: int, nsplit: int) -> tuple[int, int]:
    """(slots per split, splits) for `nsplit` requested splits of `topk` slots: whole tiles per
    split, and no split left with an empty range."""
    nsplit = max(1, min(nsplit, triton.cdiv(topk, block_k)))
    chunk = triton.cdiv(triton.cdiv(topk, nsplit), block_k) * block_k
    return chunk, triton.cdiv(topk, chunk)


def gluon_shape_ok(heads: int, dim: int, tiles: Tiles, rope_follows: bool, q_strides: tuple, idx_stride: int) -> bool:
    """The shapes kernel_gluon.py was written and gated for: 64 heads, the 512-wide latent in one
    contiguous row (no split nope/rope), the whole-width family's tiles (64-row tiles, 8 warps) with
    a split (a single pass stays on this file's kernel, which then needs no partials), rows of q and
    of the indices contiguous."""
    return (
        rope_follows and heads == 64 and dim == 512
        and tiles.block_h == 64 and tiles.block_k == 64 and tiles.block_v == 0 and tiles.num_warps == 8
        and not tiles.reload_v and tiles.nsplit > 1
        and q_strides[2] == 1 and q_strides[1] == dim and idx_stride == 1
    )


def gluon_operands_ok(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """bf16 (the dtype it was gated in) and 16-byte aligned KV rows: its cp.async gathers move 16 B
    at a time, and Triton specialises pointers and strides on multiples of 16."""
    return (
        q.dtype == torch.bfloat16 and kv.dtype == torch.bfloat16
        and kv.stride(0) % 16 == 0 and kv.data_ptr() % 16 == 0
    )


# Triton versions kernel_gluon.py was compiled and gated on: Gluon's API is experimental, and on
# other versions the block-level kernel runs (the module is not even imported).
GLUON_VALIDATED_TRITON = ("3.6.",)


@functools.lru_cache(maxsize=None)
def gluon_available() -> bool:
    """kernel_gluon.py can run here: a Hopper GPU, a Triton version it was validated on, not the
    interpreter, and not switched off with DSV4OPT_MMA_ATTN_GLUON=0 (read once per process)."""
    if _INTERPRETED or os.environ.get("DSV4OPT_MMA_ATTN_GLUON", "1") == "0" or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability()[0] != 9:
        return False
    return triton.__version__.startswith(GLUON_VALIDATED_TRITON)


def engine(q: torch.Tensor, cache: KVCache, indices: torch.Tensor, tiles: Tiles) -> str:
    """Which main loop runs for one cache: "gluon" (kernel_gluon.py) where it applies, else "triton"."""
    B, H, D = q.shape
    if (
        q.is_cuda and not cache.layout.fp8
        and gluon_shape_ok(H, D, tiles, True, q.stride(), indices.stride(1))
        and gluon_operands_ok(q, cache.data) and gluon_available()
    ):
        return "gluon"
    return "triton"


# FP8 rows are loaded whole (nope, scales and rope of a tile of tokens) and dequantised in
# registers: no value split, no second load; three pipeline stages fit the H200's shared memory.
_FP8_MAX_STAGES = 3


@dataclass(frozen=True)
class _Source:
    """One cache's share of the work: its tiles and where its splits go among all partials."""

    cache: KVCache
    indices: torch.Tensor
    lengths: torch.Tensor
    tiles: Tiles
    chunk: int
    nsplit: int
    engine: str


def _plan(q, cache: KVCache, indices, lengths, tiles: Tiles | None) -> _Source:
    B, H, D = q.shape
    K = indices.shape[1]
    t = tiles or choose_tiles(B, H, K, q.device, D)
    L = cache.layout
    if L.fp8:
        assert L.rope == L.tile and L.nope % L.tile == 0 and triton.next_power_of_2(D) % L.tile == 0, L
        t = replace(t, block_v=0, reload_v=False, num_stages=min(t.num_stages, _FP8_MAX_STAGES))
    chunk, nsplit = split_chunks(K, t.block_k, t.nsplit)
    return _Source(cache, indices, lengths, t, chunk, nsplit, engine(q, cache, indices, t))


def _launch(q, src: _Source, sink, scale, o, lse, o_part, lse_part, split_base: int, ns_total: int) -> None:
    """The main loop over one cache, writing o/lse (ns_total == 1) or its splits of the partials."""
    B, H, D = q.shape
    L, t = src.cache.layout, src.tiles
    if src.engine == "gluon":
        from dsv4opt.optimizations.mma_attn.kernel_gluon import gluon_sparse_decode_partials

        gluon_sparse_decode_partials(q, src.cache.data, src.indices, src.lengths, o_part, lse_part, src.chunk,
                                     src.nsplit, scale, split_base=split_base, ns_total=ns_total)
        return
    d_p = triton.next_power_of_2(D)
    block_v = t.block_v or d_p
    assert d_p % block_v == 0, (d_p, block_v)
    if L.fp8:
        kv8, kvu8, kv16 = src.cache.views()
        kv, stride_kv = q, 0  # p_kv only gives the kernel q's dtype to convert to
    else:
        kv = kv8 = kvu8 = kv16 = src.cache.data
        stride_kv = src.cache.data.stride(0)
    grid = (B, triton.cdiv(H, t.block_h) * (d_p // block_v), src.nsplit)
    _mma_sparse_decode_kernel[grid](
        p_q=q, p_kv=kv, p_kv8=kv8, p_kvu8=kvu8, p_kv16=kv16, p_idx=src.indices, p_len=src.lengths, p_sink=sink,
        p_o=o, p_lse=lse, p_o_part=o_part, p_lse_part=lse_part,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_kv=stride_kv, stride_ib=src.indices.stride(0),
        stride_ob=o.stride(0), stride_oh=o.stride(1),
        H=H, qk_scale_log2=scale * LOG2E, page_size=L.page_size, page_bytes=L.page_bytes if L.fp8 else 0,
        K=src.indices.shape[1], CHUNK=src.chunk, SPLIT_BASE=split_base, NS_TOTAL=ns_total,
        DN=L.nope, D=D, D_P=d_p, FP8=L.fp8, TILE=L.tile, DATA_BYTES=L.data_bytes, SCALE_BYTES=L.scale_bytes,
        BH=t.block_h, BK=t.block_k, BV=block_v, RELOAD_V=t.reload_v,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )


def mma_attention(q, swa: KVCache, swa_indices, swa_lengths, extra: KVCache | None, extra_indices,
                  extra_lengths, sink, scale, tiles: Tiles | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The `attention` slot (dsv4opt/workload/slots.py) on tensor cores.

    Each cache gets its own split-K main loop (a tile of 64 heads shares every KV tile read; FP8
    rows are dequantised in registers); every split writes fp32 partials and one combine kernel
    merges them with the sink. A single cache that needs no split writes o and lse directly.
    CUDA-graph safe: no host synchronisation; allocations have shapes fixed by the inputs'.
    """
    if q.device.type != "cuda" and not _INTERPRETED:
        raise DsvOptError(
            "mma-attn runs on a CUDA GPU; on a CPU leave it off, or set TRITON_INTERPRET=1 (slow) to run it"
        )
    B, H, D = q.shape
    parts = [(swa, swa_indices, swa_lengths)] + ([(extra, extra_indices, extra_lengths)] if extra is not None else [])
    sources = []
    for cache, indices, lengths in parts:
        check_attention_inputs(q, indices, lengths)
        assert cache.layout.dim == D and (cache.layout.fp8 or cache.data.dtype == q.dtype), (cache.layout, q.dtype)
        sources.append(_plan(q, cache, indices, lengths, tiles))
    assert sink.shape == (H,)
    ns_total = sum(src.nsplit for src in sources)
    if any(src.engine == "gluon" for src in sources):
        ns_total = max(ns_total, 2)  # the Gluon loop always writes partials
    o = torch.empty_like(q)
    lse = torch.empty(B, H, device=q.device, dtype=torch.float32)
    if ns_total > 1:
        o_part = torch.empty(B, ns_total, H, D, device=q.device, dtype=torch.float32)
        lse_part = torch.full((B, ns_total, H), float("-inf"), device=q.device, dtype=torch.float32)
    else:
        o_part, lse_part = o, lse  # unused by the single-pass kernel
    base = 0
    for src in sources:
        _launch(q, src, sink, scale, o, lse, o_part, lse_part, base, ns_total)
        base += src.nsplit
    if ns_total > 1:
        d_p = triton.next_power_of_2(D)
        _attn_combine_splits_kernel[(B, H)](
            p_o_part=o_part, p_lse_part=lse_part, p_sink=sink, p_o=o, p_lse=lse,
            stride_ob=o.stride(0), stride_oh=o.stride(1), H=H,
            NSPLIT=ns_total, NS_P=triton.next_power_of_2(ns_total), D=D, D_P=d_p, num_warps=4,
        )
    return o, lse
