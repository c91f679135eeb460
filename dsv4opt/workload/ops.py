"""Small functional pieces of the decode step (all graph-safe: no host syncs, no value branches)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x: [..., d] -> same dtype; statistics in fp32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


def rope_cos_sin(pos: torch.Tensor, rope_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """pos: [B] int64 -> cos, sin: [B, rope_dim // 2] fp32."""
    inv_freq = theta ** (-torch.arange(0, rope_dim, 2, device=pos.device, dtype=torch.float32) / rope_dim)
    angles = pos.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last rope_dim channels of x: [B, ..., d] by per-request angles cos/sin: [B, r/2].

    Half-split rotation; inverse=True undoes it (used on the attention output, as DeepSeek-V4 does).
    """
    r = 2 * cos.shape[-1]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    c, s = cos.reshape(shape), sin.reshape(shape)
    if inverse:
        s = -s
    nope, rot = x[..., :-r], x[..., -r:].float()
    a, b = rot[..., : r // 2], rot[..., r // 2 :]
    rotated = torch.cat([a * c - b * s, a * s + b * c], dim=-1).to(x.dtype)
    return torch.cat([nope, rotated], dim=-1)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """h: [..., 2F] (gate then up) -> [..., F]."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def hc_split(mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc: int, iters: int, eps: float):
    """mix: [T, 2hc + hc*hc] fp32 -> pre [T, hc], post [T, hc], comb [T, hc, hc] doubly stochastic.

    comb goes through `iters` Sinkhorn normalisations (row softmax first, then alternating column
    and row sums), as DeepSeek-V4's hyper-connections do.
    """
    pre = torch.sigmoid(mix[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(mix[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    comb = (mix[:, 2 * hc :] * scale[2] + base[2 * hc :]).view(-1, hc, hc)
    comb = torch.softmax(comb, dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb


def hc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """y: [T, d] sublayer output, residual: [T, hc, d] -> [T, hc, d]; out_i = post_i y + sum_j comb_ji res_j."""
    mixed = torch.einsum("tji,tjd->tid", comb, residual.float())
    return (post[:, :, None] * y.float()[:, None, :] + mixed).to(residual.dtype)


def pool_group(kv: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """Fold one group of tokens into a compressed entry: kv, gate: [B, ratio, d] fp32, ape: [ratio, d].

    Per-channel softmax over the group's tokens of gate + positional bias, then the weighted sum of kv.
    """
    weights = torch.softmax(gate + ape[None], dim=1)
    return (weights * kv).sum(dim=1)
