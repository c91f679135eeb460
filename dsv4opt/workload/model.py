"""One rank's batched decode step of a DeepSeek-V4-Flash-shaped model (random weights, real shapes).

What is modelled and what is not is written down in docs/workload.md. Every part of the step runs
inside a `torch.profiler.record_function` range named after it (PARTS) so the analysis can attribute
GPU time to model parts, and the whole step is free of host syncs so it can be captured as a CUDA
graph: no .item(), no nonzero, no Python branch on a tensor's value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from dsv4opt.errors import DsvOptError
from dsv4opt.workload import ops
from dsv4opt.workload.config import CSA, HCA, WINDOW, ModelConfig
from dsv4opt.workload.dense import (
    BF16, FP8_FORMAT, Dense, GroupedDense, fp8_supported, grouped_gemm_supported, quantize_rows,
)
from dsv4opt.workload.impls import resolve

PARTS = (
    "embed", "mhc_pre", "attn_norm", "q_proj", "kv_proj", "compress", "indexer", "attn", "o_proj", "mhc_post",
    "moe", "mhc_head", "lm_head",
)
GROUP_ALIGN = 16  # rows per expert group in the grouped GEMMs are padded to this (fp8 TMA alignment)


@dataclass
class Layer:
    """Weights and caches of one layer. Caches hold C requests; M compressed slots, W window slots.

    pool:      [C, M + W, D] latent KV: compressed entries first, then the raw-token window ring
    comp_kv, comp_gate: [C, ratio, D] fp32 tokens of the compression group in progress
    idx_k:     [C, M, Di] fp8 e4m3 index keys (CSA), idx_scale: [C, M] fp32
    idx_kv, idx_gate: [C, ratio, Di] fp32 index-key group in progress (CSA)
    """

    index: int
    kind: str
    slots: int  # M: compressed entries a request can hold (0 on window-only layers)
    w: dict[str, torch.Tensor | Dense | GroupedDense] = field(default_factory=dict)
    cache: dict[str, torch.Tensor] = field(default_factory=dict)


class DecodeWorkload:
    """C requests decoding one token per `step`, with their caches filled at construction.

    Two workloads built with the same arguments on the same device hold identical weights, caches
    and contexts whatever `optimizations` says: optimisations only change which implementation each
    slot (dsv4opt.workload.impls) uses.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        concurrency: int,
        context: int,
        device: str | torch.device = "cpu",
        layers: int | None = None,
        experts_resident: int | None = None,
        optimizations: Iterable[str] = (),
        seed: int = 0,
        dtype: torch.dtype = torch.bfloat16,
        weights: str = "auto",
        max_new_tokens: int = 256,
        on_layer: Callable[[int], None] | None = None,
    ):
        if concurrency < 1 or context < 1:
            raise DsvOptError("concurrency and context must be at least 1")
        self.cfg = cfg.with_layers(layers)
        cfg = self.cfg
        self.concurrency = C = concurrency
        self.context = context
        self.device = torch.device(device)
        self.dtype = dtype
        self.experts_resident = experts_resident or cfg.experts_resident_default
        if not 1 <= self.experts_resident <= cfg.experts:
            raise DsvOptError(f"--experts-resident must be within 1..{cfg.experts}")
        self.optimizations = tuple(optimizations)
        self.impls = resolve(self.optimizations)
        self.weight_format = _pick_format(weights, self.device)
        self.grouped_gemm = grouped_gemm_supported(self.device, dtype)

        host = torch.Generator().manual_seed(seed)
        lo, hi = max(1, round(0.75 * context)), max(1, round(1.25 * context))
        self.contexts = torch.randint(lo, hi + 1, (C,), generator=host)  # tokens already seen
        self.max_context = int(self.contexts.max()) + max_new_tokens
        self.pos = self.contexts.to(self.device, copy=True)  # position of the token each request decodes next
        self._rows = torch.arange(C, device=self.device)

        gen = torch.Generator(device=self.device).manual_seed(seed)
        self._gen = gen
        self.embed = self._randn(cfg.vocab, cfg.hidden, scale=1.0)
        self.layers = []
        for i in range(cfg.layers):
            self.layers.append(self._build_layer(i))
            if on_layer:
                on_layer(i)
        self.hc_head_fn = self._randn(cfg.hc, cfg.hc * cfg.hidden, dtype=torch.float32, scale=(cfg.hc * cfg.hidden) ** -0.5)
        self.hc_head_scale = torch.ones(1, device=self.device)
        self.hc_head_base = torch.zeros(cfg.hc, device=self.device)
        self.final_norm = torch.ones(cfg.hidden, device=self.device, dtype=dtype)
        # The LM head stays in the model dtype in production as well (not quantised).
        self.lm_head = Dense(self._randn(cfg.vocab, cfg.hidden), BF16)
        self.last_hidden: torch.Tensor | None = None
        self._probe_fp8()

    # ---- construction -------------------------------------------------------------------------

    def _randn(self, *shape: int, dtype: torch.dtype | None = None, scale: float | None = None) -> torch.Tensor:
        """Seeded normal weights; scale defaults to fan_in^-1/2 so activations stay O(1)."""
        t = torch.randn(*shape, generator=self._gen, device=self.device, dtype=dtype or self.dtype)
        return t.mul_(shape[-1] ** -0.5 if scale is None else scale)

    def _dense(self, out_features: int, in_features: int) -> Dense:
        return Dense(self._randn(out_features, in_features), self.weight_format)

    def _grouped(self, out_features: int, in_features: int) -> GroupedDense:
        """Resident expert weight sets; fp8 only where the grouped GEMMs run (else a dense fallback)."""
        fmt = self.weight_format if self.grouped_gemm else BF16
        return GroupedDense(self._randn(self.experts_resident, out_features, in_features), fmt)

    def _build_layer(self, i: int) -> Layer:
        cfg, C, dev = self.cfg, self.concurrency, self.device
        kind = cfg.layer_kind(i)
        H, D, G = cfg.heads, cfg.head_dim, cfg.o_groups
        ratio = cfg.ratio(kind) if kind != WINDOW else 1
        slots = 0 if kind == WINDOW else math.ceil(self.max_context / ratio)
        w: dict = {
            "attn_norm": torch.ones(cfg.hidden, device=dev, dtype=self.dtype),
            "q_a": self._dense(cfg.q_lora, cfg.hidden),
            "q_norm": torch.ones(cfg.q_lora, device=dev, dtype=self.dtype),
            "q_b": self._dense(H * D, cfg.q_lora),
            "kv": self._dense(D, cfg.hidden),
            "kv_norm": torch.ones(D, device=dev, dtype=self.dtype),
            "sink": self._randn(H, dtype=torch.float32, scale=1.0),
            "o_a": self._randn(G, cfg.o_lora, H // G * D),
            "o_b": self._dense(cfg.hidden, G * cfg.o_lora),
            "ffn_norm": torch.ones(cfg.hidden, device=dev, dtype=self.dtype),
            "router": self._randn(cfg.experts, cfg.hidden),
            "router_bias": self._randn(cfg.experts, dtype=torch.float32, scale=0.01),
            "w13": self._grouped(2 * cfg.expert_width, cfg.hidden),
            "w2": self._grouped(cfg.hidden, cfg.expert_width),
            "shared_w13": self._dense(2 * cfg.expert_width * cfg.shared_experts, cfg.hidden),
            "shared_w2": self._dense(cfg.hidden, cfg.expert_width * cfg.shared_experts),
        }
        for sub in ("attn", "ffn"):
            # Pre-mix weights stay fp32: the baseline's F.linear runs in fp32 (sm_120 fallback).
            w[f"hc_{sub}_fn"] = self._randn(cfg.hc_mix, cfg.hc * cfg.hidden, dtype=torch.float32)
            w[f"hc_{sub}_scale"] = torch.ones(3, device=dev)
            w[f"hc_{sub}_base"] = self._randn(cfg.hc_mix, dtype=torch.float32, scale=0.1)
        if i < cfg.hash_layers:
            w["hash_experts"] = torch.rand(cfg.vocab, cfg.experts, generator=self._gen, device=dev).argsort(-1)[
                :, : cfg.experts_per_token
            ].contiguous()
        cache = {"pool": self._randn(C, slots + cfg.window, D, scale=1.0)}
        if kind != WINDOW:
            w["comp_kv"] = self._dense(D, cfg.hidden)
            w["comp_gate"] = self._dense(D, cfg.hidden)
            w["comp_ape"] = self._randn(ratio, D, dtype=torch.float32, scale=0.1)
            w["comp_norm"] = torch.ones(D, device=dev, dtype=self.dtype)
            cache["comp_kv"] = self._randn(C, ratio, D, dtype=torch.float32, scale=1.0)
            cache["comp_gate"] = self._randn(C, ratio, D, dtype=torch.float32, scale=1.0)
        if kind == CSA:
            Hi, Di = cfg.index_heads, cfg.index_dim
            w["idx_q"] = self._dense(Hi * Di, cfg.q_lora)
            w["idx_w"] = self._dense(Hi, cfg.hidden)
            w["idx_kv"] = self._dense(Di, cfg.hidden)
            w["idx_gate"] = self._dense(Di, cfg.hidden)
            w["idx_ape"] = self._randn(ratio, Di, dtype=torch.float32, scale=0.1)
            keys, scale = quantize_rows(self._randn(C * slots, Di, dtype=torch.float32, scale=1.0))
            cache["idx_k"] = keys.view(C, slots, Di)
            cache["idx_scale"] = scale.view(C, slots)
            cache["idx_kv"] = self._randn(C, ratio, Di, dtype=torch.float32, scale=1.0)
            cache["idx_gate"] = self._randn(C, ratio, Di, dtype=torch.float32, scale=1.0)
        return Layer(index=i, kind=kind, slots=slots, w=w, cache=cache)

    def _probe_fp8(self) -> None:
        """Run every fp8 projection once; a shape this torch/GPU cannot run falls back to bf16."""
        self.fp8_fallbacks: list[str] = []
        if self.weight_format != FP8_FORMAT:
            return
        tried: dict[tuple, bool] = {}
        for layer in self.layers:
            for name, v in layer.w.items():
                if not isinstance(v, (Dense, GroupedDense)) or v.format != FP8_FORMAT:
                    continue
                key = (type(v).__name__, v.out_features, v.in_features)
                if key not in tried:
                    try:
                        self._try_once(v)
                        tried[key] = True
                    except (RuntimeError, NotImplementedError, AttributeError, TypeError) as exc:
                        tried[key] = False
                        self.fp8_fallbacks.append(f"{name} {v.out_features}x{v.in_features}: {str(exc).splitlines()[0][:120]}")
                if tried[key]:
                    continue
                if isinstance(v, Dense):
                    v.fall_back(self.dtype)
                else:
                    v.fall_back()

    def _try_once(self, v) -> None:
        if isinstance(v, Dense):
            v(torch.zeros(self.concurrency, v.in_features, device=self.device, dtype=self.dtype))
            return
        offs = torch.arange(1, v.groups + 1, device=self.device, dtype=torch.int32) * GROUP_ALIGN
        v.grouped(torch.zeros(v.groups * GROUP_ALIGN, v.in_features, device=self.device, dtype=self.dtype), offs)

    # ---- the decode step ----------------------------------------------------------------------

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [C] int64 -> logits [C, vocab] fp32; every request advances by one token."""
        cfg, C = self.cfg, self.concurrency
        pos = self.pos
        with record_function("embed"):
            x = self.embed[tokens]
            h = x[:, None, :].expand(C, cfg.hc, cfg.hidden).contiguous()
            cos, sin = ops.rope_cos_sin(pos, cfg.rope_dim, cfg.rope_theta)
        for layer in self.layers:
            h = self._attention_block(layer, h, pos, cos, sin)
            h = self._ffn_block(layer, h, tokens)
        with record_function("mhc_head"):
            normed = self._hc_normed(h)
            mix = F.linear(normed, self.hc_head_fn)
            pre = torch.sigmoid(mix * self.hc_head_scale + self.hc_head_base) + cfg.hc_eps
            x = (pre[:, :, None] * h.float()).sum(1).to(self.dtype)
        with record_function("lm_head"):
            logits = self.lm_head(ops.rms_norm(x, self.final_norm, cfg.norm_eps)).float()
        self.pos.add_(1)
        self.last_hidden = x
        return logits

    def _hc_normed(self, h: torch.Tensor) -> torch.Tensor:
        """h: [C, hc, d] -> the RMS-normalised flattened copies [C, hc*d] fp32."""
        flat = h.reshape(h.shape[0], -1).float()
        return flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + self.cfg.norm_eps)

    def _hc_pre(self, layer: Layer, sub: str, h: torch.Tensor):
        cfg = self.cfg
        with record_function("mhc_pre"):
            mix = self.impls["hc_premix"](self._hc_normed(h), layer.w[f"hc_{sub}_fn"])
            pre, post, comb = ops.hc_split(
                mix.float(), layer.w[f"hc_{sub}_scale"], layer.w[f"hc_{sub}_base"], cfg.hc, cfg.hc_sinkhorn_iters, cfg.hc_eps
            )
            x = (pre[:, :, None] * h.float()).sum(1).to(self.dtype)
        return x, post, comb

    def _attention_block(self, layer: Layer, h, pos, cos, sin) -> torch.Tensor:
        cfg, w, cache, C = self.cfg, layer.w, layer.cache, self.concurrency
        H, D, M, W = cfg.heads, cfg.head_dim, layer.slots, cfg.window
        x_in, post, comb = self._hc_pre(layer, "attn", h)
        with record_function("attn_norm"):
            x = ops.rms_norm(x_in, w["attn_norm"], cfg.norm_eps)
        with record_function("q_proj"):
            qa = ops.rms_norm(w["q_a"](x), w["q_norm"], cfg.norm_eps)
            q = ops.apply_rope(w["q_b"](qa).view(C, H, D), cos, sin)
        with record_function("kv_proj"):
            kv = ops.apply_rope(ops.rms_norm(w["kv"](x), w["kv_norm"], cfg.norm_eps), cos, sin)
            cache["pool"][self._rows, M + pos % W] = kv
        if layer.kind != WINDOW:
            with record_function("compress"):
                self._compress(layer, x, pos)
        with record_function("indexer" if layer.kind == CSA else "attn"):
            indices = self._select(layer, x, qa, pos)
        with record_function("attn"):
            lengths = torch.full((C,), indices.shape[1], dtype=torch.int32, device=self.device)
            o, _ = self.impls["attention"](
                q, cache["pool"].view(-1, D), indices, lengths, w["sink"], D**-0.5
            )
            o = ops.apply_rope(o, cos, sin, inverse=True)
        with record_function("o_proj"):
            g = cfg.o_groups
            low = torch.einsum("cgk,glk->cgl", o.reshape(C, g, -1), w["o_a"])
            y = w["o_b"](low.reshape(C, -1))
        with record_function("mhc_post"):
            return ops.hc_post(y, h, post, comb)

    def _compress(self, layer: Layer, x: torch.Tensor, pos: torch.Tensor) -> None:
        """Add the new token to its compression group; the group's last token emits the entry."""
        cfg, w, cache, rows = self.cfg, layer.w, layer.cache, self._rows
        ratio, M = cfg.ratio(layer.kind), layer.slots
        in_group = pos % ratio
        emit = ((pos + 1) % ratio == 0)[:, None]
        slot = (pos // ratio) % M  # wraps only past max_new_tokens; never out of bounds
        cache["comp_kv"][rows, in_group] = w["comp_kv"](x).float()
        cache["comp_gate"][rows, in_group] = w["comp_gate"](x).float()
        entry = ops.pool_group(cache["comp_kv"], cache["comp_gate"], w["comp_ape"])
        entry = ops.rms_norm(entry.to(self.dtype), w["comp_norm"], cfg.norm_eps)
        g_cos, g_sin = ops.rope_cos_sin((pos + 1 - ratio).clamp(min=0), cfg.rope_dim, cfg.rope_theta)
        entry = ops.apply_rope(entry, g_cos, g_sin)
        pool = cache["pool"]
        pool[rows, slot] = torch.where(emit, entry, pool[rows, slot])
        if layer.kind == CSA:
            cache["idx_kv"][rows, in_group] = w["idx_kv"](x).float()
            cache["idx_gate"][rows, in_group] = w["idx_gate"](x).float()
            key, key_scale = quantize_rows(ops.pool_group(cache["idx_kv"], cache["idx_gate"], w["idx_ape"]))
            keys = cache["idx_k"].view(torch.uint8)  # where/index_put on the raw bytes of the fp8 keys
            keys[rows, slot] = torch.where(emit, key.view(torch.uint8), keys[rows, slot])
            scales = cache["idx_scale"]
            scales[rows, slot] = torch.where(emit[:, 0], key_scale, scales[rows, slot])

    def _select(self, layer: Layer, x, qa, pos) -> torch.Tensor:
        """Rows of the layer's pool each request attends to: [C, K] int32, -1 for unused slots."""
        cfg, w, cache, C = self.cfg, layer.w, layer.cache, self.concurrency
        M, W = layer.slots, cfg.window
        base = (self._rows * (M + W))[:, None]
        j = torch.arange(W, device=self.device)[None, :]
        window = torch.where(j < (pos + 1)[:, None], base + M + j, -1)
        if layer.kind == WINDOW:
            return window.int()
        ratio = cfg.ratio(layer.kind)
        filled = ((pos + 1) // ratio)[:, None]  # compressed entries complete, this step's included
        s = torch.arange(M, device=self.device)[None, :]
        if layer.kind == HCA:
            comp = torch.where(s < filled, base + s, -1)
        else:
            Hi, Di = cfg.index_heads, cfg.index_dim
            q_idx = w["idx_q"](qa).view(C, Hi, Di)
            head_w = w["idx_w"](x).float() * (Hi**-0.5 * Di**-0.5)
            scores = self.impls["indexer_score"](q_idx, cache["idx_k"], cache["idx_scale"], head_w)
            scores = scores.masked_fill(s >= filled, float("-inf"))
            top = scores.topk(min(cfg.index_topk, M), dim=-1)
            comp = torch.where(torch.isfinite(top.values), base + top.indices, -1)
        return torch.cat([comp, window], dim=1).int()

    def _ffn_block(self, layer: Layer, h, tokens) -> torch.Tensor:
        cfg, w = self.cfg, layer.w
        x_in, post, comb = self._hc_pre(layer, "ffn", h)
        with record_function("moe"):
            x = ops.rms_norm(x_in, w["ffn_norm"], cfg.norm_eps)
            scores = torch.sigmoid(F.linear(x, w["router"]).float())  # [C, E]
            if "hash_experts" in w:
                ids = w["hash_experts"][tokens]
            else:
                ids = (scores + w["router_bias"]).topk(cfg.experts_per_token, dim=-1).indices
            gates = scores.gather(1, ids)
            gates = gates / gates.sum(-1, keepdim=True) * cfg.routed_scale
            routed = self._routed_experts(layer, x, ids, gates)
            shared = w["shared_w2"](ops.swiglu(w["shared_w13"](x)))
            y = routed + shared.float()
        with record_function("mhc_post"):
            return ops.hc_post(y, h, post, comb)

    def _routed_experts(self, layer: Layer, x, ids, gates) -> torch.Tensor:
        """x: [C, d], ids/gates: [C, k] -> [C, d] fp32; expert e runs on resident weight set e mod R.

        Routed rows are sorted by weight set into groups padded to GROUP_ALIGN rows and multiplied
        with one grouped GEMM per projection; group offsets stay on the device (graph-safe).
        """
        w, R = layer.w, self.experts_resident
        C, k = ids.shape
        sets = (ids % R).reshape(-1)
        if not self.grouped_gemm:
            return _routed_dense(x, sets.view(C, k), gates, w["w13"].stacked(), w["w2"].stacked(), R)
        A, n = GROUP_ALIGN, C * k
        counts = torch.zeros(R, dtype=torch.int64, device=x.device).scatter_add_(0, sets, torch.ones_like(sets))
        padded = (counts + A - 1) // A * A
        group_end = padded.cumsum(0)
        order = sets.argsort(stable=True)
        sorted_sets = sets[order]
        rank = torch.arange(n, device=x.device) - (counts.cumsum(0) - counts)[sorted_sets]
        dest = (group_end - padded)[sorted_sets] + rank
        rows = torch.zeros(n + R * (A - 1), x.shape[1], dtype=x.dtype, device=x.device)
        rows[dest] = x[order // k]
        offs = group_end.to(torch.int32)
        act = ops.swiglu(w["w13"].grouped(rows, offs))
        out = w["w2"].grouped(act, offs)
        contrib = torch.zeros(n, x.shape[1], dtype=torch.float32, device=x.device)
        contrib[order] = out[dest].float() * gates.reshape(-1)[order, None]
        return contrib.view(C, k, -1).sum(1)

    # ---- accounting ---------------------------------------------------------------------------

    def state_bytes(self) -> dict[str, int]:
        """Bytes held on the device: weights and caches (what the memory estimate predicts)."""
        weights = self.embed.nbytes + self.lm_head.nbytes + self.hc_head_fn.nbytes
        weights += sum(v.nbytes for layer in self.layers for v in layer.w.values())
        caches = sum(t.nbytes for layer in self.layers for t in layer.cache.values())
        return {"weights": weights, "caches": caches}


def _routed_dense(x, sets, gates, w13, w2, R) -> torch.Tensor:
    """Fallback without grouped GEMM: every token through every weight set, weighted by its gates."""
    combined = torch.zeros(x.shape[0], R, dtype=torch.float32, device=x.device).scatter_add_(1, sets, gates)
    act = ops.swiglu(torch.einsum("cd,rfd->rcf", x, w13))
    out = torch.einsum("rcf,rdf->rcd", act, w2)
    return torch.einsum("cr,rcd->cd", combined, out.float())


def _pick_format(weights: str, device: torch.device) -> str:
    if weights not in ("auto", BF16, FP8_FORMAT):
        raise DsvOptError(f"unknown weight format {weights!r}; use auto, bf16 or fp8")
    if weights == "auto":
        return FP8_FORMAT if fp8_supported(device) else BF16
    if weights == FP8_FORMAT and not hasattr(torch, "_scaled_mm"):
        raise DsvOptError("fp8 weights need torch._scaled_mm (torch 2.5 or newer); use bf16 weights")
    # Asked for explicitly, fp8 runs wherever _scaled_mm does (CPUs included, for tests); shapes
    # the device cannot run fall back one by one (_probe_fp8).
    return weights
