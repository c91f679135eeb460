"""How many device bytes a DecodeWorkload will need, computed from the config before allocating."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsv4opt.workload.config import CSA, WINDOW, ModelConfig

FP32, INT64 = 4, 8
WORKSPACE = 1 << 30  # cuBLAS/Triton workspaces, allocator slack and fragmentation


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    caches: int
    activations: int  # the largest transients of one step and of construction, plus WORKSPACE

    @property
    def total(self) -> int:
        return self.weights + self.caches + self.activations


def estimate_memory(
    cfg: ModelConfig,
    concurrency: int,
    context: int,
    experts_resident: int | None = None,
    elem_bytes: int = 2,
    fp8: bool = False,
    max_new_tokens: int = 256,
    fp8_experts: bool | None = None,
) -> MemoryEstimate:
    """Bytes for `cfg` (already cut to its layers) at C requests of up to 1.25 x context tokens.

    Mirrors what DecodeWorkload allocates; fp8 stores the projections other than the LM head and
    the grouped o_a as 1-byte weights with one fp32 scale per output row; fp8_experts (default:
    fp8) says whether the routed experts are fp8 too (that needs the grouped GEMMs of sm_90+).
    """
    fp8_experts = fp8 if fp8_experts is None else fp8_experts
    C, d, e = concurrency, cfg.hidden, elem_bytes
    R = experts_resident or cfg.experts_resident_default
    H, D, G, F = cfg.heads, cfg.head_dim, cfg.o_groups, cfg.expert_width
    Hi, Di = cfg.index_heads, cfg.index_dim
    max_context = max(1, round(1.25 * context)) + max_new_tokens

    def dense(out_f: int, in_f: int) -> int:
        return out_f * in_f + out_f * FP32 if fp8 else out_f * in_f * e

    weights = 2 * cfg.vocab * d * e + cfg.hc * cfg.hc * d * FP32  # embedding, LM head, hc head
    caches = 0
    for i in range(cfg.layers):
        kind = cfg.layer_kind(i)
        weights += dense(cfg.q_lora, d) + dense(H * D, cfg.q_lora) + dense(D, d) + dense(d, G * cfg.o_lora)
        weights += G * cfg.o_lora * (H // G * D) * e + H * FP32
        weights += (2 * d + cfg.q_lora + D) * e  # norms
        weights += cfg.experts * d * e + cfg.experts * FP32  # router and its bias
        weights += (R * 3 * F * d + R * (2 * F + d) * FP32) if fp8_experts else R * 3 * F * d * e
        weights += dense(2 * F * cfg.shared_experts, d) + dense(d, F * cfg.shared_experts)
        weights += 2 * (cfg.hc_mix * cfg.hc * d + 3 + cfg.hc_mix) * FP32
        if i < cfg.hash_layers:
            weights += cfg.vocab * cfg.experts_per_token * INT64
        slots = 0
        if kind != WINDOW:
            ratio = cfg.ratio(kind)
            slots = math.ceil(max_context / ratio)
            weights += 2 * dense(D, d) + ratio * D * FP32 + D * e
            caches += 2 * C * ratio * D * FP32
        if kind == CSA:
            weights += dense(Hi * Di, cfg.q_lora) + dense(Hi, d) + 2 * dense(Di, d) + ratio * Di * FP32
            caches += C * slots * (Di + FP32) + 2 * C * ratio * Di * FP32
        caches += C * (slots + cfg.window) * D * e

    csa_slots = math.ceil(max_context / cfg.csa_ratio)
    step = C * cfg.vocab * (e + 2 * FP32)  # logits in the model dtype, fp32, and argmax input
    step += C * csa_slots * (Di + Hi + 2) * FP32  # the baseline indexer: fp32 keys, [B, S, Hi] logits
    step += C * H * D * 4 * FP32 + C * cfg.hc * d * 8 * FP32  # attention and hyper-connection temps
    build = cfg.vocab * cfg.experts * (FP32 + 2 * INT64)  # hash-routing table: rand + argsort
    if fp8_experts:  # one layer's expert sets in the model dtype before quantisation
        build = max(build, R * 2 * F * d * e + 2 * F * d * 3 * FP32)
    return MemoryEstimate(weights=weights, caches=caches, activations=max(step, build) + WORKSPACE)
