"""How many device bytes a DecodeWorkload will need, computed from the config before allocating."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsv4opt.workload.config import CSA, WINDOW, ModelConfig
from dsv4opt.workload.kvcache import KVLayout
from dsv4opt.workload.layout import DEFAULT_LAYOUT, Layout
from dsv4opt.workload.quant import MXFP4_GROUP

FP32, INT32 = 4, 4
WORKSPACE = 1 << 30  # on a GPU: cuBLAS/Triton workspaces, allocator slack and fragmentation
HOST_WORKSPACE = 256 << 20  # on a CPU: the allocator's slack (no cuBLAS workspace; torch's runtime is not counted)


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    caches: int
    activations: int  # the largest transients of one step and of construction, plus the workspace

    @property
    def total(self) -> int:
        return self.weights + self.caches + self.activations


def fp8_linear_bytes(cfg: ModelConfig, out_f: int, in_f: int) -> int:
    b = cfg.fp8_block
    return out_f * in_f + math.ceil(out_f / b) * math.ceil(in_f / b) * FP32


def mxfp4_bytes(sets: int, out_f: int, in_f: int) -> int:
    return sets * out_f * (in_f // 2 + in_f // MXFP4_GROUP * FP32)


def kv_cache_bytes(layout: KVLayout, pages: int, elem_bytes: int) -> int:
    if layout.fp8:
        return pages * layout.page_bytes
    return pages * layout.page_size * layout.dim * elem_bytes


def estimate_memory(cfg: ModelConfig, concurrency: int, context: int, experts_resident: int | None = None,
                    elem_bytes: int = 2, kv_fp8: bool = True, max_new_tokens: int = 256, ranks: int = 1,
                    layout: str = DEFAULT_LAYOUT, graph_context: int | None = None,
                    workspace: int = WORKSPACE, marlin_copies: bool = False) -> MemoryEstimate:
    """Bytes for one rank of `cfg` (already cut to its layers) in `layout` at C requests of up to
    1.25 x context tokens, index rows `graph_context` wide (None: as the contexts need).

    Mirrors what DecodeWorkload allocates (tested on the tiny config). With `ranks` > 1 processes of
    a dp-ep deployment each fills every cache for all ranks' requests before keeping its own: the
    construction transient. `workspace` is the device's fixed slack: WORKSPACE on a GPU, HOST_WORKSPACE on a CPU.
    `marlin_copies`: the experts are also held in Marlin's layout (SGLang's Marlin MoE on the Hopper path).
    """
    dep = Layout.from_name(layout).deploy(cfg, ranks if ranks > 1 else None)
    C, d, e = concurrency, cfg.hidden, elem_bytes
    R = experts_resident or dep.experts
    H, D, G = cfg.heads, cfg.head_dim, cfg.o_groups
    I, Hl, Gl = dep.expert_width, dep.heads, dep.groups
    Hi, Di = cfg.index_heads, cfg.index_dim
    max_context = max(1, round(1.25 * context)) + max_new_tokens

    def layout(page: int) -> KVLayout:
        return KVLayout(kv_fp8, D - cfg.rope_dim, cfg.rope_dim, cfg.kv_tile, page)

    weights = 2 * cfg.vocab * d * e + cfg.hc * cfg.hc * d * FP32  # embedding, LM head, hc head
    weights += d * e  # final norm
    caches = 0
    largest = 0  # the largest single cache: what a rank draws `ranks` times over at once
    for i in range(cfg.layers):
        kind = cfg.layer_kind(i)
        weights += fp8_linear_bytes(cfg, cfg.q_lora + D, d) + fp8_linear_bytes(cfg, Hl * D, cfg.q_lora)
        weights += fp8_linear_bytes(cfg, d, Gl * cfg.o_lora) + Gl * cfg.o_lora * (H // G * D) * e
        weights += dep.padded_heads * FP32  # the sink
        weights += (2 * d + cfg.q_lora + D) * e  # norms
        weights += cfg.experts * d * e + cfg.experts * FP32  # router and its bias
        weights += fp8_linear_bytes(cfg, 2 * dep.shared_width, d) + fp8_linear_bytes(cfg, d, dep.shared_width)
        weights += mxfp4_bytes(R, 2 * I, d) + mxfp4_bytes(R, d, I)
        if marlin_copies:  # the same codes, e8m0 scales of one byte
            weights += R * (2 * I * (d // 2 + d // MXFP4_GROUP) + d * (I // 2 + I // MXFP4_GROUP))
        weights += 2 * (cfg.hc_mix * cfg.hc * d + 3 + cfg.hc_mix) * FP32
        if i < cfg.hash_layers:
            weights += cfg.vocab * cfg.experts_per_token * INT32
        caches += kv_cache_bytes(layout(cfg.window_page), C, e)
        largest = max(largest, kv_cache_bytes(layout(cfg.window_page), C, e))
        if kind == WINDOW:
            continue
        ratio = cfg.ratio(kind)
        coff = 2 if kind == CSA else 1
        slots = math.ceil(max_context / ratio)
        weights += 2 * coff * D * d * e + coff * ratio * D * FP32 + D * FP32  # wkv_gate, ape, norm
        extra = kv_cache_bytes(layout(cfg.extra_page(kind)), C * math.ceil(slots / cfg.extra_page(kind)), e)
        caches += extra
        largest = max(largest, extra)
        caches += C * coff * ratio * 2 * coff * D * FP32  # compressor state ring
        if kind == CSA:
            weights += fp8_linear_bytes(cfg, Hi * Di, cfg.q_lora) + Hi * d * e
            weights += 4 * Di * d * e + 8 * Di * FP32 + Di * FP32  # the indexer's compressor
            caches += C * math.ceil(slots / cfg.index_page) * cfg.index_page * (Di + 4)
            caches += C * 8 * 4 * Di * FP32

    rows = dep.moe_rows_per_request * C  # the MoE's tokens
    csa_entries = math.ceil(math.ceil(max_context / cfg.csa_ratio) / cfg.index_page) * cfg.index_page
    if graph_context:  # the indexer's page table as wide as the graph's
        csa_entries = math.ceil(graph_context / (cfg.index_page * cfg.csa_ratio)) * cfg.index_page
    step = C * cfg.vocab * (e + 2 * FP32)  # logits in the model dtype, fp32, and argmax input
    # the torch indexer: gathered pages, fp32 keys and [B, S, Hi] scores (about three alive at once)
    step += C * csa_entries * (Di + 4 + 2 * Di * FP32 + 3 * Hi * FP32)
    step += rows * cfg.experts_per_token * (3 * I + 2 * d) * FP32  # per-slot MoE intermediates
    step += C * dep.padded_heads * D * 4 * FP32 + C * cfg.hc * d * 8 * FP32  # attention and hyper-connection temps
    build = cfg.vocab * cfg.experts * (FP32 + 2 * 8)  # hash-routing table: rand + argsort
    build = max(build, 2 * max(H * D * cfg.q_lora, d * G * cfg.o_lora) * FP32)  # a weight before quantisation
    width = cfg.expert_width * cfg.shared_experts
    build = max(build, 3 * width * d * e + 4 * dep.shared_width * d * FP32)  # the whole shared expert, then its shard
    build = max(build, 2 * mxfp4_bytes(R, 2 * I, d))  # a layer's expert slices, then stacked
    if ranks > 1 and not dep.tensor_parallel:  # dp-ep ranks fill every rank's caches, then keep theirs
        build = max(build, ranks * largest)
    return MemoryEstimate(weights=weights, caches=caches, activations=max(step, build) + workspace)
