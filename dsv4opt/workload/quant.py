"""The number formats of the production model: exact encode and decode in torch, on any device.

The kernels read these layouts; the CPU path, the float64 reference and the tests decode them here,
so every reader agrees on the bytes.

- Block FP8 weights: e4m3 values with one fp32 scale per (block x block) tile.
- Activations quantised per token in groups of `group` consecutive values to e4m3, one fp32 scale
  per group (SGLang's `per_token_group_quant_fp8`).
- MXFP4 expert weights: e2m1 values packed two to a byte (even index in the low nibble), one
  power-of-two scale per 32 values, held as fp32 (SGLang's sm_120 fallback converts the e8m0
  scales to fp32 when it loads the weights).
"""

from __future__ import annotations

import torch

from dsv4opt.formats import FP8_MAX

FP8 = torch.float8_e4m3fn
MXFP4_GROUP = 32
# e2m1 magnitudes by the low three bits of a nibble (bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_RMS = (sum(v * v for v in E2M1_VALUES) / len(E2M1_VALUES)) ** 0.5
SCALE_EPS = 1e-10  # smallest amax a group is scaled by (an all-zero group stays zero)


def quantize_block_fp8(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w: [N, K] -> (e4m3 [N, K], fp32 scales [ceil(N/block), ceil(K/block)]); w ~= q * scale."""
    N, K = w.shape
    nb, kb = -(-N // block), -(-K // block)
    padded = torch.zeros(nb * block, kb * block, dtype=torch.float32, device=w.device)
    padded[:N, :K] = w.float()
    tiles = padded.view(nb, block, kb, block)
    scale = tiles.abs().amax(dim=(1, 3)).clamp(min=SCALE_EPS) / FP8_MAX  # [nb, kb]
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(nb * block, kb * block)[:N, :K].contiguous(), scale


def dequantize_block_fp8(q: torch.Tensor, scale: torch.Tensor, block: int, dtype=torch.float64) -> torch.Tensor:
    """The weight a block-FP8 pair stands for, [N, K] in `dtype`."""
    N, K = q.shape
    s = scale.to(dtype).repeat_interleave(block, 0)[:N].repeat_interleave(block, 1)[:, :K]
    return q.to(dtype) * s


def quantize_groups_fp8(x: torch.Tensor, group: int, eps: float = SCALE_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] (K a multiple of group) -> (e4m3 [M, K], fp32 scales [M, K // group]).

    scale = max(amax of the group, eps) / 448, q = x / scale rounded to e4m3; computed in x's
    precision (float64 in the reference, fp32 in the kernels: tritonlib.quantize_e4m3).
    """
    M, K = x.shape
    assert K % group == 0, (K, group)
    g = x.reshape(M, K // group, group)
    scale = g.abs().amax(dim=-1).clamp(min=eps) / FP8_MAX
    q = (g / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.reshape(M, K), scale.float()


def dequantize_groups_fp8(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    M, K = q.shape
    group = K // scale.shape[1]
    return (q.to(dtype).view(M, -1, group) * scale.to(dtype)[..., None]).view(M, K)


def random_mxfp4(shape: tuple[int, ...], fan_in: int, generator: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 weights [..., N, K]: (packed uint8 [..., N, K/2], fp32 scales [..., N, K/32]).

    Uniform random nibbles with one power-of-two scale per group, chosen so the dequantised weights
    have standard deviation about fan_in^-1/2, as the other random weights do.
    """
    *lead, N, K = shape
    assert K % MXFP4_GROUP == 0, K
    packed = torch.randint(0, 256, (*lead, N, K // 2), generator=generator, device=device, dtype=torch.uint8)
    exponent = round(torch.log2(torch.tensor(fan_in**-0.5 / _E2M1_RMS)).item())
    scales = torch.full((*lead, N, K // MXFP4_GROUP), 2.0**exponent, device=device, dtype=torch.float32)
    # A little spread between groups, still powers of two (what e8m0 can hold).
    jitter = torch.randint(-1, 2, scales.shape, generator=generator, device=device)
    return packed, scales * torch.pow(2.0, jitter.float())


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """packed [..., N, K/2] uint8, scales [..., N, K/32] -> weights [..., N, K] in `dtype`."""
    lut = torch.tensor(E2M1_VALUES, dtype=dtype, device=packed.device)
    nib = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2).long()  # [..., N, K]
    mag = lut[nib & 7]
    val = torch.where(nib >= 8, -mag, mag)
    return val * scales.to(dtype).repeat_interleave(MXFP4_GROUP, dim=-1)
