"""The bytes one rank's decode step must move at the least: its floor at the GPU's bandwidth.

Counted from the config, the layout and the requests' contexts in production formats (block-FP8
dense weights with their fp32 block scales, MXFP4 experts with 1-byte e8m0 scales, SGLang's 584-byte
KV records, 132-byte index keys), whatever format a stand-in keeps. Each part is read once:

- dense weights: every projection, router, compressor and mHC pre-mix weight of every layer
  (wo_a block FP8 on the Hopper path, bf16 on the sm_120 path);
- experts: the expected number of distinct experts C tokens touch (each picks `experts_per_token`
  of `experts` without repeats, uniformly), each expert's slice of this rank;
- KV: per request and layer the window rows, the top-k compressed rows (CSA) or every compressed row
  (HCA), and on CSA layers every index key the indexer scores;
- indexer logit rows: on CSA layers each request's fp32 scores over its own entries, written and read
  back by the top-k. SGLang's logits tensor is as wide as the graph's metadata, but only allocated
  there: DeepGEMM writes a row over the request's entries (clean_logits off) and the top-k reads no
  further (docs/optimizations/indexer-topk.md, "Floor", with file:line);
- head: the embedding rows, the LM head (the whole of it: this workload runs it on every rank).

Activations, the compressor state and the scheduler's own traffic are left out: each is far below
these at decode sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4opt.workload.config import CSA, HCA, ModelConfig
from dsv4opt.workload.layout import Layout
from dsv4opt.workload.memory import fp8_linear_bytes
from dsv4opt.workload.quant import MXFP4_GROUP

BF16, FP32 = 2, 4
KV_RECORD = 584  # 576 data + 8 scale bytes a token
INDEX_KEY = 132  # 128 e4m3 values + an fp32 scale


@dataclass(frozen=True)
class StepFloor:
    parts: dict[str, float]  # bytes per part

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def ms(self, bandwidth_gbs: float) -> float:
        return self.total / (bandwidth_gbs * 1e9) * 1e3


def experts_touched(cfg: ModelConfig, tokens: int) -> float:
    """Expected distinct experts `tokens` tokens route to, each to `experts_per_token` distinct ones."""
    return cfg.experts * (1 - (1 - cfg.experts_per_token / cfg.experts) ** tokens)


def _fp8_linears(cfg: ModelConfig, dep, kind: str, fp8_wo_a: bool) -> int:
    """Bytes of one layer's block-FP8 linears (with their scales) on one rank."""
    D, d, Gl = cfg.head_dim, cfg.hidden, dep.groups
    out = fp8_linear_bytes(cfg, cfg.q_lora + D, d) + fp8_linear_bytes(cfg, dep.heads * D, cfg.q_lora)
    out += fp8_linear_bytes(cfg, d, Gl * cfg.o_lora)
    out += fp8_linear_bytes(cfg, 2 * dep.shared_width, d) + fp8_linear_bytes(cfg, d, dep.shared_width)
    if fp8_wo_a:
        out += fp8_linear_bytes(cfg, Gl * cfg.o_lora, cfg.heads // cfg.o_groups * D)
    if kind == CSA:
        out += fp8_linear_bytes(cfg, cfg.index_heads * cfg.index_dim, cfg.q_lora)
    return out


def fp8_weight_bytes(cfg: ModelConfig, layout: str, fp8_wo_a: bool = False) -> int:
    """Bytes of every block-FP8 linear of one rank's step: what its FP8 GEMMs must read."""
    dep = Layout.from_name(layout).deploy(cfg)
    return sum(_fp8_linears(cfg, dep, cfg.layer_kind(i), fp8_wo_a) for i in range(cfg.layers))


def step_floor(cfg: ModelConfig, layout: str, contexts: list[int], fp8_wo_a: bool = False) -> StepFloor:
    """The floor of one step of one rank of `layout` decoding len(contexts) requests."""
    dep = Layout.from_name(layout).deploy(cfg)
    C, d, D = len(contexts), cfg.hidden, cfg.head_dim
    Gl = dep.groups
    parts = {"dense weights": 0.0, "experts": 0.0, "KV and index keys": 0.0, "indexer logit rows": 0.0, "head": 0.0}
    expert = 3 * dep.expert_width * d * (0.5 + 1 / MXFP4_GROUP)  # one expert's slice: nibbles + e8m0 bytes
    touched = experts_touched(cfg, dep.moe_rows_per_request * C)
    wo_a = Gl * cfg.o_lora * (cfg.heads // cfg.o_groups * D)
    for i in range(cfg.layers):
        kind = cfg.layer_kind(i)
        dense = _fp8_linears(cfg, dep, kind, fp8_wo_a) + (0 if fp8_wo_a else wo_a * BF16)
        dense += cfg.experts * d * BF16 + 2 * cfg.hc_mix * cfg.hc * d * FP32  # router, the two pre-mix weights
        kv = sum(min(n + 1, cfg.window) for n in contexts) * KV_RECORD
        if kind == CSA:
            dense += cfg.index_heads * d * BF16  # weights_proj
            dense += (2 * 2 * D + 2 * 2 * cfg.index_dim) * d * BF16  # the core and index compressors (overlapped)
            entries = [(n + 1) // cfg.csa_ratio for n in contexts]
            kv += sum(min(e, cfg.index_topk) for e in entries) * KV_RECORD + sum(entries) * INDEX_KEY
            parts["indexer logit rows"] += 2 * sum(entries) * FP32
        elif kind == HCA:
            dense += 2 * D * d * BF16
            kv += sum((n + 1) // cfg.hca_ratio for n in contexts) * KV_RECORD
        parts["dense weights"] += dense
        parts["experts"] += touched * expert
        parts["KV and index keys"] += kv
    parts["head"] = cfg.vocab * d * BF16 + C * d * BF16
    return StepFloor(parts)
