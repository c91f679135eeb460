"""An all-torch float64 reference of one decode step, written request by request.

It reads a DecodeWorkload's weights and caches without changing them and recomputes the step the
plain way: one request at a time, explicit lists of the entries each layer attends to, a dense
softmax, one expert at a time. It quantises exactly where the model does (activations to e4m3 in
groups before every FP8 linear, index queries and keys to e4m3, KV rows into their cache layout,
MXFP4 expert weights decoded exactly); everything else is float64, so against a float32 model the
remaining differences are float32 rounding.
"""

from __future__ import annotations

import torch

from dsv4opt.workload import quant
from dsv4opt.workload.config import CSA, WINDOW
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.kvcache import quantize_index_key, quantize_rows

F64 = torch.float64


def decode_step_ref(wl, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens: [C] -> (logits [C, vocab], final hidden [C, hidden]), float64 on the CPU: what one
    process playing rank 0 alone computes (under tensor parallelism its slices, no all-reduce)."""
    outs = [_Request(wl, b, int(tokens[b]), int(wl.pos[b])).run() for b in range(wl.concurrency)]
    return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", F64)


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y * _f64(weight) if weight is not None else y


def _fp8_linear(layer_w, x: torch.Tensor) -> torch.Tensor:
    """An Fp8Linear applied as the kernels do: x quantised to e4m3 in groups, times the dequantised weight."""
    q, s = quant.quantize_groups_fp8(x[None, :], layer_w.block)
    return layer_w.dense() @ quant.dequantize_groups_fp8(q, s)[0]


class _Request:
    def __init__(self, wl, b: int, tok: int, p: int):
        self.wl, self.cfg, self.b, self.tok, self.p = wl, wl.cfg, b, tok, p
        self.cos, self.sin = _f64(wl.cos), _f64(wl.sin)

    def rope(self, x: torch.Tensor, at: int, inverse: bool = False) -> torch.Tensor:
        return naive.rope(x[None], self.cos, self.sin, torch.tensor([at]), inverse=inverse)[0]

    def stored(self, row: torch.Tensor, layout) -> torch.Tensor:
        """A latent row as it reads back from a cache of `layout` (FP8: e4m3 nope, bf16 rope)."""
        if not layout.fp8:
            return row.to(self.wl.dtype).to(F64)
        nope8, exps, rope = quantize_rows(row[None], layout)
        scale = torch.exp2(exps.to(F64) - 127.0).repeat_interleave(layout.tile, 1)[:, : layout.nope]
        return torch.cat([nope8.to(F64) * scale, rope.to(F64)], dim=1)[0]

    def run(self) -> tuple[torch.Tensor, torch.Tensor]:
        wl, cfg = self.wl, self.cfg
        h = _f64(wl.embed[self.tok])[None, :].repeat(cfg.hc, 1)
        for layer in wl.layers:
            w = layer.w
            x_in, post, comb = self.hc_pre(h, w["hc_attn_fn"], w["hc_attn_scale"], w["hc_attn_base"])
            h = post[:, None] * self.attention(layer, x_in)[None, :] + comb.t() @ h
            x_in, post, comb = self.hc_pre(h, w["hc_ffn_fn"], w["hc_ffn_scale"], w["hc_ffn_base"])
            h = post[:, None] * self.moe(layer, _rms(x_in, w["ffn_norm"], cfg.norm_eps))[None, :] + comb.t() @ h
        flat = h.reshape(-1)
        mix = _f64(wl.hc_head_fn) @ flat / torch.sqrt((flat * flat).mean() + cfg.norm_eps)
        pre = torch.sigmoid(mix * _f64(wl.hc_head_scale) + _f64(wl.hc_head_base)) + cfg.hc_eps
        x = (pre[:, None] * h).sum(0)
        return _f64(wl.lm_head) @ _rms(x, wl.final_norm, cfg.norm_eps), x

    def hc_pre(self, h, fn, scale, base):
        """h: [hc, d] -> (x [d], post [hc], comb [hc, hc])."""
        cfg = self.cfg
        flat = h.reshape(-1)
        mix = (_f64(fn) @ flat) / torch.sqrt((flat * flat).mean() + cfg.norm_eps)
        pre, post, comb = naive.hc_split_sinkhorn(mix[None], _f64(scale), _f64(base), cfg.hc, cfg.hc_sinkhorn_iters,
                                                  cfg.hc_eps)
        return (pre[0][:, None] * h).sum(0), post[0], comb[0]

    # ---- attention ----------------------------------------------------------------------------

    def attention(self, layer, x_in: torch.Tensor) -> torch.Tensor:
        cfg, w, b, p = self.cfg, layer.w, self.b, self.p
        D, W = cfg.head_dim, cfg.window
        H = w["wq_b"].out_features // D  # this rank's heads
        x = _rms(x_in, w["attn_norm"], cfg.norm_eps)
        qkv_a = _fp8_linear(w["wqkv_a"], x)
        q_lora = _rms(qkv_a[: cfg.q_lora], w["q_norm"], cfg.norm_eps)
        q = self.rope(_rms(_fp8_linear(w["wq_b"], q_lora).view(H, D), None, cfg.norm_eps), p)
        kv_new = self.rope(_rms(qkv_a[cfg.q_lora :], w["kv_norm"], cfg.norm_eps), p)
        swa, page = layer.swa, cfg.window_page
        window = []
        for t in range(max(0, p - W + 1), p + 1):
            row = self.stored(kv_new, swa.layout) if t == p else swa.read(torch.tensor([b * page + t % page]))[0].cpu()
            window.append(row)
        entries = torch.stack(window)
        if layer.kind != WINDOW:
            comp = self.compressed_entries(layer, x)
            if layer.kind == CSA and comp.shape[0] > 0:
                comp = comp[self.indexer_selection(layer, x, q_lora)]
            entries = torch.cat([comp, entries])
        logits = (q @ entries.t()) * D**-0.5  # [H, K]
        sink = _f64(w["sink"])[:H]  # the padded heads' zeros dropped
        top = torch.maximum(logits.max(-1).values, sink)
        prob = torch.exp(logits - top[:, None])
        o = prob @ entries / (torch.exp(sink - top) + prob.sum(-1))[:, None]
        o = self.rope(o, p, inverse=True)
        if isinstance(w["wo_a"], list):  # block FP8, one linear a group (the Hopper path)
            G = len(w["wo_a"])
            low = torch.stack([_fp8_linear(lin, og) for lin, og in zip(w["wo_a"], o.reshape(G, -1))])
        else:
            G = w["wo_a"].shape[0]  # this rank's output groups
            low = torch.einsum("gk,glk->gl", o.reshape(G, -1), _f64(w["wo_a"]))
        return _fp8_linear(w["wo_b"], low.reshape(-1))

    def pooled(self, layer, prefix: str, x: torch.Tensor, ratio: int, overlap: bool) -> torch.Tensor:
        """The entry this token's group emits (valid when (p + 1) % ratio == 0), before norm."""
        w = layer.w
        state = layer.index_state if prefix == "idx" else layer.state
        kv_score = _f64(w[f"{prefix}_wkv_gate"]) @ x
        return naive.compress(_f64(state[self.b : self.b + 1]), kv_score[None], _f64(w[f"{prefix}_ape"]),
                              torch.tensor([self.p]), ratio, overlap)[0]

    def compressed_entries(self, layer, x: torch.Tensor) -> torch.Tensor:
        """The request's complete compressed entries after token p, as the attention reads them."""
        cfg, p = self.cfg, self.p
        ratio = cfg.ratio(layer.kind)
        n = (p + 1) // ratio
        assert n <= layer.slots, "the reference assumes the cache has not wrapped"
        span = layer.pages * cfg.extra_page(layer.kind)
        rows = layer.extra.read(torch.arange(n, device=layer.extra.data.device) + self.b * span).cpu()
        if (p + 1) % ratio == 0:  # token p completes entry n - 1
            y = _rms(self.pooled(layer, "comp", x, ratio, layer.kind == CSA), layer.w["comp_norm"], cfg.norm_eps)
            rows[n - 1] = self.stored(self.rope(y, p + 1 - ratio), layer.extra.layout)
        return rows

    def indexer_selection(self, layer, x: torch.Tensor, q_lora: torch.Tensor) -> torch.Tensor:
        """Which compressed entries the indexer keeps: top-k of its scores (all of them if <= k)."""
        cfg, w, p = self.cfg, layer.w, self.p
        Hi, Di = cfg.index_heads, cfg.index_dim
        n = (p + 1) // cfg.csa_ratio
        weights = _f64(w["idx_weights_proj"]) @ x
        q = naive.hadamard(torch.stack([self.rope(r, p) for r in _fp8_linear(w["idx_wq_b"], q_lora).view(Hi, Di)]))
        q8, q_scale = quantize_index_key(q)
        head_w = weights * Di**-0.5 * Hi**-0.5 * q_scale.to(F64)
        span = layer.index_pages * cfg.index_page
        keys, scales = layer.index_keys.read(torch.arange(n, device=layer.index_keys.data.device) + self.b * span)
        keys, scales = keys.cpu(), scales.cpu()
        if (p + 1) % cfg.csa_ratio == 0:
            y = _rms(self.pooled(layer, "idx", x, cfg.csa_ratio, True), w["idx_norm"], cfg.norm_eps)
            k8, ks = quantize_index_key(naive.hadamard(self.rope(y, p + 1 - cfg.csa_ratio))[None])
            keys[n - 1], scales[n - 1] = k8[0].to(F64), ks[0].to(F64)
        scores = (head_w[:, None] * (q8.to(F64) @ keys.t()).clamp(min=0)).sum(0) * scales
        return scores.topk(min(cfg.index_topk, n)).indices

    # ---- MoE ----------------------------------------------------------------------------------

    def moe(self, layer, x: torch.Tensor) -> torch.Tensor:
        wl, cfg, w = self.wl, self.cfg, layer.w
        limit = cfg.swiglu_limit
        shared = _fp8_linear(w["shared_w2"], naive.silu_mul_clamp(_fp8_linear(w["shared_w13"], x), limit))
        scores = naive.sqrt_softplus(_f64(w["router"]) @ x)
        if "hash_experts" in w:
            ids = w["hash_experts"][self.tok].cpu().long()
        else:
            ids = (scores + _f64(w["router_bias"])).topk(cfg.experts_per_token).indices
        gates = scores[ids] / scores[ids].sum()
        routed = torch.zeros_like(x)
        for e, g in zip(ids.tolist(), gates):
            r = e if wl.tensor_parallel else e % wl.experts_resident  # the rank's slice of e, or its stand-in
            act = naive.silu_mul_clamp(w["w13"].dense(r) @ x, limit)
            routed = routed + g * (w["w2"].dense(r) @ act)
        # SGLang's sm_120 path scales the routed sum inside its MoE kernel and again when it adds
        # the shared expert (see docs/workload.md); 0.5.23's Hopper path once.
        again = cfg.routed_scale if wl.path.routed_scaled_twice else 1.0
        return shared + again * (cfg.routed_scale * routed)

