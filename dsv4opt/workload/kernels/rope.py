"""RMS norm + RoPE kernels of the attention's q/kv path, and the latent-row store they share.

RoPE rotates the last `rope` dims of a row in interleaved pairs (x[2i], x[2i+1]) by angle
pos * theta^(-2i/rope), read from a cos/sin table [positions, rope/2] (SGLang's `freqs_cis`).

- `q_norm_rope` stands for SGLang's `fused_q_norm_rope` (jit main_norm_rope.cuh:65-162): each
  head's 512 values RMS-normalised without a weight, rounded to the model dtype, the rope dims rotated.
- `kv_norm_rope_store` stands for `fused_k_norm_rope_flashmla` (main_norm_rope.cuh:236-335, via
  `set_swa_key_buffer_radix_fused_norm_rope`): RMS norm with weight, rope, and the store into the
  window cache in its layout (FP8: e4m3 nope with one UE8M0 scale per 64 values, bf16 rope).
- `rope_inplace` stands for `fused_rope_inplace` (rope.cuh), used inverted on the attention output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4opt.tritonlib import FP8_MAX, interpreted, round_to_bf16, round_to_e4m3, runs_triton
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.kvcache import AMAX_EPS, KVCache

FP8_MAX_ = tl.constexpr(FP8_MAX)
AMAX_EPS_ = tl.constexpr(AMAX_EPS)


@triton.jit
def rotate_pairs(b_re, b_im, p_cos, p_sin, pos, R2: tl.constexpr, INVERSE: tl.constexpr):
    """Rotate pairs (re, im) [R2] by the angles of position `pos`."""
    o_i = tl.arange(0, R2)
    b_c = tl.load(p_cos + pos * R2 + o_i)
    b_s = tl.load(p_sin + pos * R2 + o_i)
    if INVERSE:
        b_s = -b_s
    return b_re * b_c - b_im * b_s, b_re * b_s + b_im * b_c


@triton.jit
def _ceil_pow2_exponent(x):
    """ceil(log2(x)) for x > 0 (fp32), exactly, from the bits: exponent + (mantissa != 0)."""
    bits = x.to(tl.int32, bitcast=True)
    return ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)


@triton.jit
def store_latent(b_nope, b_re, b_im, t, p_data, p_u8, p_rope16, page_size, page_bytes, stride_row,
                  DN: tl.constexpr, TILE: tl.constexpr, TILES_P: tl.constexpr, R2: tl.constexpr,
                  FP8: tl.constexpr, DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr, EMULATE: tl.constexpr):
    """Write one latent row (nope [TILES_P, TILE] fp32, rope pairs [R2] fp32) as token t of a cache."""
    o_t = tl.arange(0, TILES_P)
    o_c = tl.arange(0, TILE)
    o_n = o_t[:, None] * TILE + o_c[None, :]  # [TILES_P, TILE] nope column of each element
    m_n = o_n < DN
    o_i = tl.arange(0, R2)
    t = t.to(tl.int64)
    if FP8:
        page = t // page_size
        slot = t % page_size
        at = page * page_bytes + slot * DATA_BYTES
        at_s = page * page_bytes + page_size * DATA_BYTES + slot * SCALE_BYTES
        b_amax = tl.maximum(tl.max(tl.where(m_n, tl.abs(b_nope), 0.0), axis=1), AMAX_EPS_)  # [TILES_P]
        b_e = _ceil_pow2_exponent(b_amax / FP8_MAX_)  # [TILES_P] UE8M0 exponents
        b_q = round_to_e4m3(tl.clamp(b_nope * tl.exp2(-b_e.to(tl.float32))[:, None], -FP8_MAX_, FP8_MAX_), EMULATE)
        tl.store(p_data + at + o_n, b_q.to(p_data.dtype.element_ty), mask=m_n)
        tl.store(p_u8 + at_s + o_t, (b_e + 127).to(tl.uint8), mask=o_t * TILE < DN)
        p_r = p_rope16 + (at + DN) // 2 + 2 * o_i
        tl.store(p_r, round_to_bf16(b_re, EMULATE).to(tl.bfloat16))
        tl.store(p_r + 1, round_to_bf16(b_im, EMULATE).to(tl.bfloat16))
    else:
        p_row = p_data + t * stride_row
        tl.store(p_row + o_n, b_nope.to(p_data.dtype.element_ty), mask=m_n)
        tl.store(p_row + DN + 2 * o_i, b_re.to(p_data.dtype.element_ty))
        tl.store(p_row + DN + 2 * o_i + 1, b_im.to(p_data.dtype.element_ty))



def cache_args(cache: KVCache) -> dict:
    """Keyword arguments `store_latent` takes for `cache` (pointers, geometry, constexprs)."""
    L = cache.layout
    if L.fp8:
        data8, u8, rope16 = cache.views()
        ptrs = dict(p_data=data8, p_u8=u8, p_rope16=rope16, stride_row=0)
    else:
        ptrs = dict(p_data=cache.data, p_u8=cache.data, p_rope16=cache.data, stride_row=cache.data.stride(0))
    return dict(**ptrs, page_size=L.page_size, page_bytes=L.page_bytes if L.fp8 else 0,
                DN=L.nope, TILE=L.tile, TILES_P=triton.next_power_of_2(L.tiles), R2=L.rope // 2,
                FP8=L.fp8, DATA_BYTES=L.data_bytes, SCALE_BYTES=L.scale_bytes, EMULATE=interpreted())


@triton.jit
def _load_row(p_row, DN: tl.constexpr, TILE: tl.constexpr, TILES_P: tl.constexpr, R2: tl.constexpr):
    """A latent row in fp32 as (nope [TILES_P, TILE], rope re [R2], rope im [R2])."""
    o_n = tl.arange(0, TILES_P)[:, None] * TILE + tl.arange(0, TILE)[None, :]
    b_nope = tl.load(p_row + o_n, mask=o_n < DN, other=0.0).to(tl.float32)
    o_i = tl.arange(0, R2)
    b_re = tl.load(p_row + DN + 2 * o_i).to(tl.float32)
    b_im = tl.load(p_row + DN + 2 * o_i + 1).to(tl.float32)
    return b_nope, b_re, b_im


@triton.jit
def _kv_norm_rope_store_kernel(p_kv, p_w, p_cos, p_sin, p_pos, p_loc, stride_kv, eps,
                               p_data, p_u8, p_rope16, page_size, page_bytes, stride_row,
                               DN: tl.constexpr, TILE: tl.constexpr, TILES_P: tl.constexpr, R2: tl.constexpr,
                               FP8: tl.constexpr, DATA_BYTES: tl.constexpr, SCALE_BYTES: tl.constexpr,
                               EMULATE: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    b_nope, b_re, b_im = _load_row(p_kv + i_b * stride_kv, DN, TILE, TILES_P, R2)
    D: tl.constexpr = DN + 2 * R2
    b_r = tl.rsqrt((tl.sum(tl.sum(b_nope * b_nope, axis=1), axis=0) + tl.sum(b_re * b_re + b_im * b_im, axis=0)) / D + eps)
    w_nope, w_re, w_im = _load_row(p_w, DN, TILE, TILES_P, R2)
    b_nope = b_nope * b_r * w_nope
    pos = tl.load(p_pos + i_b)
    b_re, b_im = rotate_pairs(b_re * b_r * w_re, b_im * b_r * w_im, p_cos, p_sin, pos, R2, False)
    store_latent(b_nope, b_re, b_im, tl.load(p_loc + i_b), p_data, p_u8, p_rope16, page_size, page_bytes, stride_row,
                  DN, TILE, TILES_P, R2, FP8, DATA_BYTES, SCALE_BYTES, EMULATE)


def kv_norm_rope_store(kv: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                       pos: torch.Tensor, cache: KVCache, loc: torch.Tensor) -> None:
    """kv: [B, D] (may be a strided view), weight: [D]; writes norm(kv) * weight, rope at pos[b],
    as token loc[b] of `cache`. cos/sin: [positions, rope/2] fp32."""
    if not runs_triton(kv):
        y = naive.rope(naive.rms_norm(kv.float(), weight, eps), cos, sin, pos)
        cache.write(loc, y)
        return
    assert kv.stride(1) == 1
    B = kv.shape[0]
    if B:
        _kv_norm_rope_store_kernel[(B,)](p_kv=kv, p_w=weight, p_cos=cos, p_sin=sin, p_pos=pos, p_loc=loc,
                                         stride_kv=kv.stride(0), eps=eps, **cache_args(cache), num_warps=4)


@triton.jit
def _q_norm_rope_kernel(p_q, p_out, p_cos, p_sin, p_pos, stride_qb, stride_qh, stride_ob, stride_oh, eps,
                        DN: tl.constexpr, TILE: tl.constexpr, TILES_P: tl.constexpr, R2: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    b_nope, b_re, b_im = _load_row(p_q + i_b * stride_qb + i_h * stride_qh, DN, TILE, TILES_P, R2)
    D: tl.constexpr = DN + 2 * R2
    b_r = tl.rsqrt((tl.sum(tl.sum(b_nope * b_nope, axis=1), axis=0) + tl.sum(b_re * b_re + b_im * b_im, axis=0)) / D + eps)
    dt = p_out.dtype.element_ty
    # normalised values are rounded to the model dtype before the rotation, as SGLang's kernel does
    b_nope = (b_nope * b_r).to(dt)
    b_re, b_im = rotate_pairs((b_re * b_r).to(dt).to(tl.float32), (b_im * b_r).to(dt).to(tl.float32),
                         p_cos, p_sin, tl.load(p_pos + i_b), R2, False)
    o_n = tl.arange(0, TILES_P)[:, None] * TILE + tl.arange(0, TILE)[None, :]
    p_row = p_out + i_b * stride_ob + i_h * stride_oh
    tl.store(p_row + o_n, b_nope, mask=o_n < DN)
    o_i = tl.arange(0, R2)
    tl.store(p_row + DN + 2 * o_i, b_re.to(dt))
    tl.store(p_row + DN + 2 * o_i + 1, b_im.to(dt))


def q_norm_rope(q: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
                rope: int, tile: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """q: [B, H, D] -> per-head RMS norm (no weight), rope on the last `rope` dims: [B, H, D],
    into `out` when given (any head stride: the first heads of a padded buffer)."""
    if not runs_triton(q):
        y = naive.rope(naive.rms_norm(q, None, eps), cos, sin, pos)
        return y if out is None else out.copy_(y)
    B, H, D = q.shape
    assert q.stride(2) == 1 and rope % 2 == 0
    if out is None:
        out = torch.empty(B, H, D, device=q.device, dtype=q.dtype)
    assert out.shape == q.shape and out.stride(2) == 1
    dn = D - rope
    if B:
        _q_norm_rope_kernel[(B, H)](p_q=q, p_out=out, p_cos=cos, p_sin=sin, p_pos=pos,
                                    stride_qb=q.stride(0), stride_qh=q.stride(1), stride_ob=out.stride(0),
                                    stride_oh=out.stride(1), eps=eps, DN=dn, TILE=tile,
                                    TILES_P=triton.next_power_of_2(-(-dn // tile)), R2=rope // 2, num_warps=4)
    return out


@triton.jit
def _rope_inplace_kernel(p_x, p_cos, p_sin, p_pos, stride_b, stride_h, OFFSET: tl.constexpr, R2: tl.constexpr,
                         INVERSE: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    o_i = tl.arange(0, R2)
    p_row = p_x + i_b * stride_b + i_h * stride_h + OFFSET
    b_re = tl.load(p_row + 2 * o_i).to(tl.float32)
    b_im = tl.load(p_row + 2 * o_i + 1).to(tl.float32)
    b_re, b_im = rotate_pairs(b_re, b_im, p_cos, p_sin, tl.load(p_pos + i_b), R2, INVERSE)
    tl.store(p_row + 2 * o_i, b_re.to(p_x.dtype.element_ty))
    tl.store(p_row + 2 * o_i + 1, b_im.to(p_x.dtype.element_ty))


def rope_inplace(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, rope: int,
                 inverse: bool = False) -> None:
    """Rotate the last `rope` dims of x: [B, H, D] in place (inverse: by the negative angles)."""
    if not runs_triton(x):
        x.copy_(naive.rope(x, cos, sin, pos, inverse=inverse))
        return
    B, H, D = x.shape
    assert x.stride(2) == 1
    if B:
        _rope_inplace_kernel[(B, H)](p_x=x, p_cos=cos, p_sin=sin, p_pos=pos, stride_b=x.stride(0), stride_h=x.stride(1),
                                     OFFSET=D - rope, R2=rope // 2, INVERSE=inverse, num_warps=1)
