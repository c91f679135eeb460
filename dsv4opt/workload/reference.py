"""An all-torch float64 reference of one decode step, written request by request.

It reads a DecodeWorkload's weights and caches without changing them and recomputes the step the
plain way: one request at a time, explicit lists of the entries each layer attends to, a dense
softmax, one expert at a time. The batched model (graph-safe index arithmetic, slot kernels,
grouped GEMMs) is tested against it.
"""

from __future__ import annotations

import torch

from dsv4opt.workload.config import CSA, WINDOW

FP8_MAX = 448.0


def decode_step_ref(wl, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens: [C] -> (logits [C, vocab], final hidden [C, hidden]), float64 on the CPU."""
    outs = [_one_request(wl, b, int(tokens[b]), int(wl.pos[b])) for b in range(wl.concurrency)]
    return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def _w(v) -> torch.Tensor:
    """A weight as float64 [out, in] (dense projections expose their effective weight)."""
    return _f64(v.dense()) if hasattr(v, "dense") else _f64(v)


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * _f64(weight) if weight is not None else y


def _rope(x: torch.Tensor, p: int, cfg, inverse: bool = False) -> torch.Tensor:
    """Rotate the last rope_dim channels of x: [..., d] to position p (half-split pairs)."""
    r = cfg.rope_dim
    i = torch.arange(0, r, 2, dtype=torch.float64)
    angle = p * cfg.rope_theta ** (-i / r)
    c, s = torch.cos(angle), torch.sin(angle) * (-1 if inverse else 1)
    a, b = x[..., -r : -r // 2], x[..., -r // 2 :]
    return torch.cat([x[..., :-r], a * c - b * s, a * s + b * c], dim=-1)


def _swiglu(h: torch.Tensor) -> torch.Tensor:
    gate, up = h.chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up


def _hc_pre(h: torch.Tensor, fn, scale, base, cfg):
    """h: [hc, d] -> (x [d], post [hc], comb [hc, hc])."""
    n = cfg.hc
    flat = h.reshape(-1)
    mix = _f64(fn) @ (flat / torch.sqrt((flat * flat).mean() + cfg.norm_eps))
    scale, base = _f64(scale), _f64(base)
    pre = torch.sigmoid(mix[:n] * scale[0] + base[:n]) + cfg.hc_eps
    post = 2 * torch.sigmoid(mix[n : 2 * n] * scale[1] + base[n : 2 * n])
    comb = torch.softmax((mix[2 * n :] * scale[2] + base[2 * n :]).view(n, n), dim=-1) + cfg.hc_eps
    comb = comb / (comb.sum(0, keepdim=True) + cfg.hc_eps)
    for _ in range(cfg.hc_sinkhorn_iters - 1):
        comb = comb / (comb.sum(1, keepdim=True) + cfg.hc_eps)
        comb = comb / (comb.sum(0, keepdim=True) + cfg.hc_eps)
    return (pre[:, None] * h).sum(0), post, comb


def _hc_post(y, h, post, comb):
    return post[:, None] * y[None, :] + comb.t() @ h


def _pool(kv: torch.Tensor, gate: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    return (torch.softmax(gate + _f64(ape), dim=0) * kv).sum(0)


def _fp8_round_trip(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().max().clamp(min=1e-12) / FP8_MAX
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).double() * scale


def _compressed_entries(wl, layer, b: int, p: int, xn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This request's complete compressed entries after token p: KV [n, D] and (CSA) index keys [n, Di]."""
    cfg, w, cache = wl.cfg, layer.w, layer.cache
    r = cfg.ratio(layer.kind)
    n = (p + 1) // r
    assert p // r < layer.slots, "the reference assumes the cache has not wrapped"
    kv = _f64(cache["pool"][b, :n])
    keys = None
    if layer.kind == CSA:
        keys = _f64(cache["idx_k"][b, :n]) * _f64(cache["idx_scale"][b, :n])[:, None]
    if (p + 1) % r == 0:  # token p completes group n - 1: it replaces whatever the slot held
        st_kv, st_gate = _f64(cache["comp_kv"][b]), _f64(cache["comp_gate"][b])
        st_kv[p % r], st_gate[p % r] = _w(w["comp_kv"]) @ xn, _w(w["comp_gate"]) @ xn
        entry = _rms(_pool(st_kv, st_gate, w["comp_ape"]), w["comp_norm"], cfg.norm_eps)
        kv[n - 1] = _rope(entry, max(p + 1 - r, 0), cfg)
        if keys is not None:
            st_k, st_g = _f64(cache["idx_kv"][b]), _f64(cache["idx_gate"][b])
            st_k[p % r], st_g[p % r] = _w(w["idx_kv"]) @ xn, _w(w["idx_gate"]) @ xn
            keys[n - 1] = _fp8_round_trip(_pool(st_k, st_g, w["idx_ape"]))
    return kv, keys


def _attention(wl, layer, b: int, p: int, x_in: torch.Tensor) -> torch.Tensor:
    cfg, w, cache = wl.cfg, layer.w, layer.cache
    H, D, W, M = cfg.heads, cfg.head_dim, cfg.window, layer.slots
    xn = _rms(x_in, w["attn_norm"], cfg.norm_eps)
    qa = _rms(_w(w["q_a"]) @ xn, w["q_norm"], cfg.norm_eps)
    q = _rope((_w(w["q_b"]) @ qa).view(H, D), p, cfg)
    kv_new = _rope(_rms(_w(w["kv"]) @ xn, w["kv_norm"], cfg.norm_eps), p, cfg)
    window = [kv_new if t == p else _f64(cache["pool"][b, M + t % W]) for t in range(max(0, p - W + 1), p + 1)]
    entries = torch.stack(window)
    if layer.kind != WINDOW:
        comp, keys = _compressed_entries(wl, layer, b, p, xn)
        if layer.kind == CSA and comp.shape[0] > 0:
            Hi, Di = cfg.index_heads, cfg.index_dim
            q_idx = (_w(w["idx_q"]) @ qa).view(Hi, Di)
            head_w = (_w(w["idx_w"]) @ xn) * (Hi**-0.5 * Di**-0.5)
            scores = (head_w[:, None] * (q_idx @ keys.t()).clamp(min=0)).sum(0)
            keep = scores.topk(min(cfg.index_topk, M, comp.shape[0])).indices
            comp = comp[keep]
        entries = torch.cat([comp, entries])
    logits = (q @ entries.t()) * D**-0.5  # [H, K]
    sink = _f64(w["sink"])
    top = torch.maximum(logits.max(-1).values, sink)
    prob = torch.exp(logits - top[:, None])
    o = prob @ entries / (torch.exp(sink - top) + prob.sum(-1))[:, None]
    o = _rope(o, p, cfg, inverse=True)
    G = cfg.o_groups
    low = torch.einsum("gk,glk->gl", o.reshape(G, -1), _f64(w["o_a"]))
    return _w(w["o_b"]) @ low.reshape(-1)


def _moe(wl, layer, x_in: torch.Tensor, tok: int) -> torch.Tensor:
    cfg, w = wl.cfg, layer.w
    xn = _rms(x_in, w["ffn_norm"], cfg.norm_eps)
    scores = torch.sigmoid(_f64(w["router"]) @ xn)
    if "hash_experts" in w:
        ids = w["hash_experts"][tok].cpu()
    else:
        ids = (scores + _f64(w["router_bias"])).topk(cfg.experts_per_token).indices
    gates = scores[ids] / scores[ids].sum() * cfg.routed_scale
    out = _w(w["shared_w2"]) @ _swiglu(_w(w["shared_w13"]) @ xn)
    for e, g in zip(ids.tolist(), gates):
        r = e % wl.experts_resident
        out = out + g * (_f64(w["w2"].dense(r)) @ _swiglu(_f64(w["w13"].dense(r)) @ xn))
    return out


def _one_request(wl, b: int, tok: int, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = wl.cfg
    h = _f64(wl.embed[tok])[None, :].repeat(cfg.hc, 1)
    for layer in wl.layers:
        w = layer.w
        x_in, post, comb = _hc_pre(h, w["hc_attn_fn"], w["hc_attn_scale"], w["hc_attn_base"], cfg)
        h = _hc_post(_attention(wl, layer, b, p, x_in), h, post, comb)
        x_in, post, comb = _hc_pre(h, w["hc_ffn_fn"], w["hc_ffn_scale"], w["hc_ffn_base"], cfg)
        h = _hc_post(_moe(wl, layer, x_in, tok), h, post, comb)
    flat = h.reshape(-1)
    mix = _f64(wl.hc_head_fn) @ (flat / torch.sqrt((flat * flat).mean() + cfg.norm_eps))
    pre = torch.sigmoid(mix * _f64(wl.hc_head_scale) + _f64(wl.hc_head_base)) + cfg.hc_eps
    x = (pre[:, None] * h).sum(0)
    logits = _w(wl.lm_head) @ _rms(x, wl.final_norm, cfg.norm_eps)
    return logits, x
