"""Plain-torch definitions of the baseline kernels: what each computes, written the direct way.

They serve twice: on a CPU outside Triton's interpreter they are the workload's path (SGLang's
torch fallbacks play the same part), and called with float64 inputs they are the references the
Triton kernels are tested against. Arithmetic is in float64 when the inputs are float64, else fp32.
"""

from __future__ import annotations

import torch

from dsv4opt.workload import quant


def _acc(*ts: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x: [..., n] -> x / sqrt(mean(x^2) + eps) * weight, in x's dtype."""
    dt = _acc(x)
    xf = x.to(dt)
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(dt)
    return y.to(x.dtype)


def hc_prenorm(h2: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """h2: [T, K] -> (h2 as fp32 (float64 stays float64), rsqrt(mean(h2^2) + eps) [T])."""
    flat = h2.to(_acc(h2))
    return flat, torch.rsqrt(flat.square().mean(-1) + eps)


def hc_split_sinkhorn(mix, scale, base, hc: int, iters: int, eps: float):
    """mix: [T, 2hc + hc*hc] -> pre [T, hc], post [T, hc], comb [T, hc, hc]: sigmoid gates, then a
    row softmax of comb and `iters` alternating column/row normalisations (columns first)."""
    dt = _acc(mix)
    mix, scale, base = mix.to(dt), scale.to(dt), base.to(dt)
    pre = torch.sigmoid(mix[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(mix[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    comb = (mix[:, 2 * hc :] * scale[2] + base[2 * hc :]).view(-1, hc, hc)
    comb = torch.softmax(comb, dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb


def hc_post(y, residual, post, comb) -> torch.Tensor:
    """out[t, i] = post[t, i] * y[t] + sum_j comb[t, j, i] * residual[t, j], in residual's dtype."""
    dt = _acc(y, residual, post)
    mixed = torch.einsum("tji,tjd->tid", comb.to(dt), residual.to(dt))
    return (post.to(dt)[:, :, None] * y.to(dt)[:, None, :] + mixed).to(residual.dtype)


def block_fp8_matmul(a, a_scale, w, w_scale, block: int) -> torch.Tensor:
    """Dequantised a (group scales) times dequantised w (block scales) transposed, fp32/float64."""
    dt = torch.float64 if a_scale.dtype == torch.float64 else torch.float32
    return quant.dequantize_groups_fp8(a, a_scale, dt) @ quant.dequantize_block_fp8(w, w_scale, block, dt).t()


def mm_out_fp32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    dt = _acc(x, w)
    return x.to(dt) @ w.to(dt).t()


def mxfp4_slot_gemv(a, rows, experts, w, w_scale) -> torch.Tensor:
    """out[s] = a[rows[s]] @ dequant(w[experts[s]])^T, in a's dtype (float64 in, float64 out)."""
    dt = _acc(a)
    weights = quant.dequantize_mxfp4(w[experts.long()], w_scale[experts.long()], dt)  # [S, N, K]
    return torch.einsum("sk,snk->sn", a[rows.long()].to(dt), weights).to(a.dtype)


def routed_experts(x, local_ids, gates, w13, w2, limit: float, scale: float) -> torch.Tensor:
    """The `routed_experts` slot's definition (dsv4opt/workload/slots.py), expert by expert in the
    accumulation dtype (float64 for float64 x): scale * sum over the slots on this rank of
    gate * w2[e] @ silu_mul_clamp(w13[e] @ x)."""
    dt = _acc(x)
    out = torch.zeros(x.shape, dtype=dt, device=x.device)
    for e in torch.unique(local_ids[local_ids >= 0]).tolist():
        m, j = torch.nonzero(local_ids == e, as_tuple=True)
        w_up = quant.dequantize_mxfp4(w13.packed[e], w13.scales[e], dt)  # [2I, d]
        w_down = quant.dequantize_mxfp4(w2.packed[e], w2.scales[e], dt)  # [d, I]
        act = silu_mul_clamp(x[m].to(dt) @ w_up.t(), limit)
        out.index_add_(0, m, gates[m, j].to(dt)[:, None] * (act @ w_down.t()))
    return (scale * out).to(x.dtype)


def sqrt_softplus(x: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(torch.nn.functional.softplus(x))


def moe_gate(logits, bias, topk: int, tokens=None, table=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ids (top-k of scores + bias, or table[tokens]) and their scores renormalised."""
    scores = sqrt_softplus(logits.to(_acc(logits)))
    if table is not None:
        ids = table[tokens.long()].long()
    else:
        ids = (scores + bias.to(scores.dtype)).topk(topk, dim=-1).indices
    w = scores.gather(1, ids)
    return ids.int(), (w / w.sum(-1, keepdim=True)).to(torch.float64 if logits.dtype == torch.float64 else torch.float32)


def silu_mul_clamp(x: torch.Tensor, limit: float) -> torch.Tensor:
    I = x.shape[-1] // 2
    g = x[..., :I].clamp(max=limit).to(_acc(x))
    u = x[..., I:].clamp(-limit, limit).to(_acc(x))
    return (torch.nn.functional.silu(g) * u).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last 2 * cos.shape[1] dims of x: [B, ..., D] in interleaved pairs (x[2i], x[2i+1])
    by the angles of position pos[b]; cos/sin: [positions, r/2]. Result in x's dtype."""
    dt = _acc(x, cos)
    r2 = cos.shape[1]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (r2,)
    c = cos[pos.long()].to(dt).reshape(shape)
    s = sin[pos.long()].to(dt).reshape(shape) * (-1 if inverse else 1)
    rot = x[..., -2 * r2 :].to(dt)
    re, im = rot[..., 0::2], rot[..., 1::2]
    out = torch.stack([re * c - im * s, re * s + im * c], dim=-1).flatten(-2)
    return torch.cat([x[..., : -2 * r2].to(dt), out], dim=-1).to(x.dtype)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] (n a power of two) times the Sylvester Hadamard matrix / sqrt(n)."""
    n = x.shape[-1]
    h = torch.ones(1, 1, dtype=x.dtype, device=x.device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return x @ h.t() / n**0.5


def compress(state, kv_score, ape, pos, ratio: int, overlap: bool) -> torch.Tensor:
    """The compressed entry a group's last token emits ([C, hd]; rows of other tokens are zero).

    state: [C, ring, W] the projections of earlier tokens by position mod ring (W = 4hd with
    overlap: kv_ov | kv | score_ov | score; else kv | score); kv_score: [C, W] this token's.
    Entry = per-channel softmax over the window of score + ape, weighting kv; with overlap the
    window is the previous group's overlap halves then this group's main halves.
    """
    dt = _acc(state, kv_score)
    C, ring, W = state.shape
    hd = ape.shape[1]
    win = 2 * ratio if overlap else ratio
    j = torch.arange(win, device=state.device)
    q = pos.long()[:, None] - (win - 1) + j[None, :]  # [C, win] positions of the window
    rows = state[torch.arange(C, device=state.device)[:, None], q % ring].to(dt)  # [C, win, W]
    rows[:, -1] = kv_score.to(dt)  # this token's projection is not in the state yet
    first = (j < ratio) & overlap  # overlap halves of the previous group
    kv_at = torch.where(first, 0, hd if overlap else 0)
    sc_at = torch.where(first, 2 * hd, 3 * hd if overlap else hd)
    cols = torch.arange(hd, device=state.device)
    kv = rows.gather(2, (kv_at[:, None] + cols[None, :]).expand(C, win, hd))
    score = rows.gather(2, (sc_at[:, None] + cols[None, :]).expand(C, win, hd)) + ape.to(dt)[None]
    valid = (q >= 0)[..., None]
    score = score.masked_fill(~valid, float("-inf"))
    pooled = (torch.softmax(score, dim=1) * kv.masked_fill(~valid, 0.0)).sum(1)
    emit = ((pos.long() + 1) % ratio == 0)[:, None]
    return torch.where(emit, pooled, torch.zeros_like(pooled))


def index_logits(q8, weights, keys, key_scales, seq_lens) -> torch.Tensor:
    """logits[b, s] = key_scales[b, s] * sum_h weights[b, h] * relu(q8[b, h] . keys[b, s]); -inf at
    s >= seq_lens[b]. q8: [B, H, dim]; keys: [B, S, dim]; key_scales: [B, S] (decoded, any float)."""
    dt = torch.float64
    dots = torch.einsum("bhd,bsd->bhs", q8.to(dt), keys.to(dt)).clamp(min=0)
    logits = (weights.to(dt)[:, :, None] * dots).sum(1) * key_scales.to(dt)
    s = torch.arange(keys.shape[1], device=keys.device)
    return logits.masked_fill(s[None, :] >= seq_lens[:, None], float("-inf"))


def index_topk(q8, weights, keys, key_scales, seq_lens, base, topk: int) -> torch.Tensor:
    """The `indexer_topk` slot: base[b] + s for the top-`topk` index_logits among s < seq_lens[b],
    highest first, equal scores by lower s; all s < seq_lens[b] in order when there are at most
    `topk`; -1 after. keys: [B, S, dim]; key_scales: [B, S]; base: [B] -> [B, topk] int64."""
    logits = index_logits(q8, weights, keys, key_scales, seq_lens)
    B, S = logits.shape
    order = torch.sort(logits, dim=1, descending=True, stable=True).indices
    s = torch.arange(S, device=logits.device).expand(B, S)
    few = (seq_lens <= topk)[:, None]
    ranked = torch.where(few, s, order)  # a request with at most topk entries keeps them all, in order
    k = min(topk, S)
    slot = torch.arange(k, device=logits.device)[None, :]
    out = torch.where(slot < seq_lens.long().clamp(max=k)[:, None], base.long()[:, None] + ranked[:, :k], -1)
    return torch.nn.functional.pad(out, (0, topk - k), value=-1)


def hc_split_sum(mix, rsqrt, flat, scale, base, hc: int, iters: int, eps: float, dtype: torch.dtype):
    """The `hc_split_sum` slot: Sinkhorn split of mix * rsqrt, x = sum_i pre_i * copy_i in `dtype`."""
    dt = _acc(mix, flat)
    T = flat.shape[0]
    pre, post, comb = hc_split_sinkhorn(mix.to(dt) * rsqrt.to(dt)[:, None], scale, base, hc, iters, eps)
    x = (pre[:, :, None] * flat.to(dt).view(T, hc, -1)).sum(1)
    return x.to(dtype), post, comb


def moe_local(ids, owner, row_rank) -> torch.Tensor:
    """The `moe_local` slot: owner[row_rank[m], ids[m, j]] [M, k] in owner's dtype."""
    return owner[row_rank.long()[:, None], ids.long()]


def moe_slots(local_ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The slot set-up of the per-slot path: local set max(local, 0), row m, invalid (local < 0)
    and slot number, each [M*k] (int32, int32, bool, int32)."""
    M, k = local_ids.shape
    flat = local_ids.reshape(-1)
    s = torch.arange(M * k, device=local_ids.device)
    return flat.clamp(min=0).to(torch.int32), (s // k).to(torch.int32), flat < 0, s.to(torch.int32)


def moe_act(inter: torch.Tensor, limit: float) -> torch.Tensor:
    """The SwiGLU between the two slot GEMVs: silu_mul_clamp of each slot's row."""
    return silu_mul_clamp(inter, limit)


def moe_combine(down, invalid, gates, scale: float) -> torch.Tensor:
    """The per-slot path's output [M, d] in down's dtype (float64 in, float64 out): scale *
    sum_j gates[m, j] * down[m*k + j] over the slots that are not invalid."""
    dt = _acc(down)
    M, k = gates.shape
    valid = down.to(dt).masked_fill(invalid[:, None], 0.0).view(M, k, -1)
    return (scale * (valid * gates.to(dt)[:, :, None]).sum(1)).to(down.dtype)


def hc_pre_gemm(h2: torch.Tensor, fn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h2: [T, K] -> (h2 @ fn^T [T, N], sum(h2^2) [T]), computed in fp32 (float64 stays float64)."""
    dt = _acc(h2, fn)
    flat = h2.to(dt)
    return flat @ fn.to(dt).t(), flat.square().sum(-1)


def hc_pre_from_partials(mix, sq, h, scale, base, norm_weight, hc: int, iters: int, hc_eps: float, norm_eps: float,
                         dtype: torch.dtype):
    """The Hopper path's pre step after its GEMM: partials [S, T, N] and [S, T] summed, the RMS factor,
    split and Sinkhorn, the weighted sum of the copies h [T, hc, d] in `dtype`, its RMSNorm."""
    T, _, d = h.shape
    dt = mix.dtype
    rsqrt = torch.rsqrt(sq.sum(0) / (hc * d) + norm_eps)
    pre, post, comb = hc_split_sinkhorn(mix.sum(0) * rsqrt[:, None], scale, base, hc, iters, hc_eps)
    x = (pre[:, :, None] * h.to(dt)).sum(1).to(dtype)
    return rms_norm(x, norm_weight, norm_eps), post, comb


def hc_pre_fused(h, fn, scale, base, norm_weight, hc: int, iters: int, hc_eps: float, norm_eps: float,
                 dtype: torch.dtype):
    """The whole pre step and the sublayer's RMSNorm from the copies h [T, hc, d]: the definition
    both paths compute (sm_120: hc_prenorm, F.linear, split and sum, rms_norm; Hopper: mhc_fused.py)."""
    mix, sq = hc_pre_gemm(h.reshape(h.shape[0], -1), fn)
    return hc_pre_from_partials(mix[None], sq[None], h, scale, base, norm_weight, hc, iters, hc_eps, norm_eps, dtype)
