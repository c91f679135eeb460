"""The compressor's kernels of the sm_120 path (compressor_v2.py:415-535 at sgl-project/sglang@37ef295c7).

- `compress_forward` stands for the JIT `FlashCompress4Kernel` / `FlashCompress128Kernel` decode
  kernels (jit csrc c4_v2.cuh, c128_v2.cuh): the token's kv/score projection goes into the
  request's state ring; a group's last token pools the window into a compressed entry (per-channel
  softmax of score + ape over the window, weighting kv). CSA (ratio 4) overlaps: its window is the
  previous group's overlap halves and this group's main halves (8 slots).
- `compress_norm_rope_store` stands for the JIT `FusedNormRopeKernel` (fused_norm_rope_v2.cuh):
  for tokens that completed a group, RMS norm (fp32 weight), rounding to the model dtype, RoPE at the
  group's first position, then the store: into the attention's compressed cache (its layout), or,
  for the indexer, a 128-point Hadamard rotation and e4m3 with one fp32 scale per key.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import interpreted, quantize_e4m3, runs_triton
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.kernels.rope import cache_args, rotate_pairs, store_latent  # noqa: F401
from dsv4opt.workload.kvcache import AMAX_EPS, IndexKeyCache, KVCache, quantize_index_key

AMAX_EPS_ = tl.constexpr(AMAX_EPS)


@triton.jit
def _compress_kernel(p_state, p_in, p_ape, p_pos, p_out, stride_sb, stride_ss, stride_in, stride_out,
                     HD: tl.constexpr, RATIO: tl.constexpr, OVERLAP: tl.constexpr, RING: tl.constexpr,
                     WIN: tl.constexpr, BLOCK_D: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    i_d = tl.program_id(1)
    pos = tl.load(p_pos + i_b).to(tl.int64)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < HD
    W: tl.constexpr = 4 * HD if OVERLAP else 2 * HD
    # this token's projection into its ring slot (each program its own columns of every part)
    for part in range(0, W, HD):
        b_x = tl.load(p_in + i_b * stride_in + part + o_d, mask=m_d, other=0.0)
        tl.store(p_state + i_b * stride_sb + (pos % RING) * stride_ss + part + o_d, b_x, mask=m_d)
    if (pos + 1) % RATIO == 0:
        o_j = tl.arange(0, WIN)
        q = pos - (WIN - 1) + o_j  # [WIN] positions in the window
        first = (o_j < RATIO) & OVERLAP
        kv_at = tl.where(first, 0, HD if OVERLAP else 0)
        sc_at = tl.where(first, 2 * HD, 3 * HD if OVERLAP else HD)
        m_j = (q >= 0)[:, None] & m_d[None, :]
        now = (q == pos)[:, None]
        # the current token's row is read from the input, not from the ring slot just written
        p_row = tl.where(now, p_in + i_b * stride_in, p_state + i_b * stride_sb + (q % RING)[:, None] * stride_ss)
        b_kv = tl.load(p_row + kv_at[:, None] + o_d[None, :], mask=m_j, other=0.0)  # [WIN, BD]
        b_sc = tl.load(p_row + sc_at[:, None] + o_d[None, :], mask=m_j, other=0.0)
        b_sc = b_sc + tl.load(p_ape + o_j[:, None] * HD + o_d[None, :], mask=m_d[None, :], other=0.0)
        b_sc = tl.where(m_j, b_sc, float("-inf"))
        b_w = tl.exp(b_sc - tl.max(b_sc, axis=0)[None, :])
        b_out = tl.sum(b_w * b_kv, axis=0) / tl.sum(b_w, axis=0)
        tl.store(p_out + i_b * stride_out + o_d, b_out, mask=m_d)


def compress_forward(state: torch.Tensor, kv_score: torch.Tensor, ape: torch.Tensor, pos: torch.Tensor,
                     ratio: int, overlap: bool) -> torch.Tensor:
    """state: [C, ring, W] fp32 (updated in place), kv_score: [C, W] fp32, ape: [win, hd] fp32,
    pos: [C] -> entries [C, hd] fp32, written only for tokens that complete a group (pos + 1) % ratio == 0."""
    if not runs_triton(state):
        out = naive.compress(state, kv_score, ape, pos, ratio, overlap)
        state[torch.arange(state.shape[0], device=state.device), pos.long() % state.shape[1]] = kv_score.to(state.dtype)
        return out
    C, ring, W = state.shape
    hd = ape.shape[1]
    assert state.dtype == torch.float32 and state.stride(2) == 1 and kv_score.stride(1) == 1
    out = torch.empty(C, hd, device=state.device, dtype=torch.float32)
    block = min(64 if ratio > 8 else 128, triton.next_power_of_2(hd))
    if C:
        _compress_kernel[(C, triton.cdiv(hd, block))](
            p_state=state, p_in=kv_score, p_ape=ape, p_pos=pos, p_out=out, stride_sb=state.stride(0),
            stride_ss=state.stride(1), stride_in=kv_score.stride(0), stride_out=out.stride(0),
            HD=hd, RATIO=ratio, OVERLAP=overlap, RING=ring, WIN=ape.shape[0], BLOCK_D=block, num_warps=4,
        )
    return out


@triton.jit
def _norm_rope_store_kernel(p_x, p_w, p_cos, p_sin, p_pos, p_loc, stride_x, eps, ratio,
                            p_data, p_u8, p_rope16, page_size, page_bytes, stride_row,
                            DN: tl.constexpr, TILE: tl.constexpr, TILES_P: tl.constexpr, R2: tl.constexpr,
                            FP8: tl.constexpr, DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr,
                            EMULATE: tl.constexpr, DTYPE: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    pos = tl.load(p_pos + i_b)
    if (pos + 1) % ratio == 0:
        o_n = tl.arange(0, TILES_P)[:, None] * TILE + tl.arange(0, TILE)[None, :]
        o_i = tl.arange(0, R2)
        p_row = p_x + i_b * stride_x
        b_nope = tl.load(p_row + o_n, mask=o_n < DN, other=0.0)
        b_re = tl.load(p_row + DN + 2 * o_i)
        b_im = tl.load(p_row + DN + 2 * o_i + 1)
        D: tl.constexpr = DN + 2 * R2
        b_r = tl.rsqrt((tl.sum(tl.sum(b_nope * b_nope, axis=1), axis=0) + tl.sum(b_re * b_re + b_im * b_im, axis=0)) / D + eps)
        b_nope = (b_nope * b_r * tl.load(p_w + o_n, mask=o_n < DN, other=0.0)).to(DTYPE).to(tl.float32)
        b_re = (b_re * b_r * tl.load(p_w + DN + 2 * o_i)).to(DTYPE).to(tl.float32)
        b_im = (b_im * b_r * tl.load(p_w + DN + 2 * o_i + 1)).to(DTYPE).to(tl.float32)
        b_re, b_im = rotate_pairs(b_re, b_im, p_cos, p_sin, pos + 1 - ratio, R2, False)
        store_latent(b_nope, b_re, b_im, tl.load(p_loc + i_b), p_data, p_u8, p_rope16, page_size, page_bytes,
                      stride_row, DN, TILE, TILES_P, R2, FP8, DATA_BYTES, SCALE_BYTES, EMULATE)


@triton.jit
def hadamard_row(b_x, o_n, N: tl.constexpr):
    """b_x [N] times the Sylvester Hadamard matrix / sqrt(N): sign(i, j) = (-1)^popcount(i & j)."""
    v = o_n[:, None] & o_n[None, :]
    v = v ^ (v >> 8)
    v = v ^ (v >> 4)
    v = v ^ (v >> 2)
    v = v ^ (v >> 1)
    sign = 1.0 - 2.0 * (v & 1).to(tl.float32)  # [N, N]
    return tl.sum(sign * b_x[None, :], axis=1) * (1.0 / tl.sqrt(N * 1.0))


@triton.jit
def rope_flat(b_x, b_xp, o_n, p_cos, p_sin, pos, DN: tl.constexpr, R2: tl.constexpr):
    """Interleaved RoPE on the dims >= DN of a flat row, given each element's pair partner b_xp."""
    m_r = o_n >= DN
    i = tl.where(m_r, (o_n - DN) // 2, 0)
    b_c = tl.load(p_cos + pos * R2 + i, mask=m_r, other=1.0)
    b_s = tl.load(p_sin + pos * R2 + i, mask=m_r, other=0.0)
    even = (o_n % 2) == 0
    return tl.where(m_r, b_x * b_c + tl.where(even, -b_xp, b_xp) * b_s, b_x)


@triton.jit
def _index_key_store_kernel(p_x, p_w, p_cos, p_sin, p_pos, p_loc, p_cache8, p_cache32, stride_x, eps, ratio,
                            page_size, N: tl.constexpr, DN: tl.constexpr, EMULATE: tl.constexpr, DTYPE: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    pos = tl.load(p_pos + i_b)
    if (pos + 1) % ratio == 0:
        o_n = tl.arange(0, N)
        b_x = tl.load(p_x + i_b * stride_x + o_n)
        b_xp = tl.load(p_x + i_b * stride_x + (o_n ^ 1))  # pair partners, for the rotation
        b_r = tl.rsqrt(tl.sum(b_x * b_x, axis=0) / N + eps)
        b_x = (b_x * b_r * tl.load(p_w + o_n)).to(DTYPE).to(tl.float32)
        b_xp = (b_xp * b_r * tl.load(p_w + (o_n ^ 1))).to(DTYPE).to(tl.float32)
        b_y = hadamard_row(rope_flat(b_x, b_xp, o_n, p_cos, p_sin, pos + 1 - ratio, DN, (N - DN) // 2), o_n, N)
        b_q, b_s = quantize_e4m3(b_y, AMAX_EPS_, EMULATE)
        t = tl.load(p_loc + i_b).to(tl.int64)
        page = t // page_size
        slot = t % page_size
        at = page * page_size * (N + 4)  # first byte of the page
        tl.store(p_cache8 + at + slot * N + o_n, b_q.to(p_cache8.dtype.element_ty))
        tl.store(p_cache32 + (at + page_size * N) // 4 + slot, b_s)


def _dtype(t: torch.Tensor):
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[t]


def compress_norm_rope_store(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                             pos: torch.Tensor, loc: torch.Tensor, ratio: int, rope: int, model_dtype: torch.dtype,
                             cache: KVCache | IndexKeyCache) -> None:
    """Norm, rope and store the entries of tokens that completed a group.

    x: [C, hd] fp32 entries (other rows are never read); weight: [hd] fp32; loc: [C] entry numbers.
    Attention caches (KVCache) take the row in their layout; the index-key cache takes
    Hadamard(row) in e4m3 with its fp32 scale.
    """
    if not runs_triton(x):
        emit = (pos.long() + 1) % ratio == 0
        y = naive.rms_norm(x.float(), weight, eps).to(model_dtype)
        y = naive.rope(y.float(), cos, sin, (pos + 1 - ratio).clamp(min=0))
        idx = emit.nonzero().flatten()  # CPU path only: a host sync is harmless here
        if isinstance(cache, IndexKeyCache):
            keys, scales = quantize_index_key(naive.hadamard(y[idx]))
            cache.write(loc[idx], keys, scales)
        else:
            cache.write(loc[idx], y[idx])
        return
    C, hd = x.shape
    assert x.stride(1) == 1
    if not C:
        return
    if isinstance(cache, IndexKeyCache):
        assert hd % 4 == 0
        raw = cache.data.view(-1)  # typed views of the same bytes: e4m3 keys, fp32 scales
        _index_key_store_kernel[(C,)](
            p_x=x, p_w=weight, p_cos=cos, p_sin=sin, p_pos=pos, p_loc=loc, p_cache8=raw.view(torch.float8_e4m3fn),
            p_cache32=raw.view(torch.float32),
            stride_x=x.stride(0), eps=eps, ratio=ratio, page_size=cache.page_size, N=hd, DN=hd - rope,
            EMULATE=interpreted(), DTYPE=_dtype(model_dtype), num_warps=4,
        )
        return
    _norm_rope_store_kernel[(C,)](p_x=x, p_w=weight, p_cos=cos, p_sin=sin, p_pos=pos, p_loc=loc, stride_x=x.stride(0),
                                  eps=eps, ratio=ratio, DTYPE=_dtype(model_dtype), **cache_args(cache), num_warps=4)
