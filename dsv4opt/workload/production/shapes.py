"""The shapes SGLang's real kernels see in one rank's decode step, and the bytes each must move.

From the named config and layout (dsv4-flash at tp4 by default), as the workload builds its weights
(dsv4opt/workload/model.py `_build_layer`): the block-FP8 linears a rank runs per layer, the
indexer's pages, the mHC boundary, the routed experts' slices. A bytes floor counts each operand
once (weights, their scales, activations read and written) in SGLang's formats.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4opt.workload.config import CSA, ModelConfig
from dsv4opt.workload.layout import Layout

BF16, FP32, E8M0 = 2, 4, 1


@dataclass(frozen=True)
class Gemm:
    name: str
    n: int  # output features
    k: int  # input features
    per_step: int  # calls in one decode step

    def weight_bytes(self, block: int) -> int:
        return self.n * self.k + -(-self.n // block) * -(-self.k // block) * FP32

    def bytes(self, tokens: int, block: int) -> int:
        """DeepGEMM's GEMM alone: the e4m3 activations and their scales in, the bf16 output out."""
        return self.weight_bytes(block) + tokens * (self.k + self.k // block * FP32 + self.n * BF16)


def deployment(config: str = "dsv4-flash", layout: str = "tp4"):
    cfg = ModelConfig.from_name(config)
    return cfg, Layout.from_name(layout).deploy(cfg)


def csa_layers(cfg: ModelConfig) -> int:
    return sum(cfg.layer_kind(i) == CSA for i in range(cfg.layers))


def dense_gemms(cfg: ModelConfig, dep, fp8_wo_a: bool = False) -> list[Gemm]:
    """One rank's block-FP8 linears (model.py:_build_layer), each with its calls per step."""
    L, D = cfg.layers, cfg.head_dim
    out = [
        Gemm("wqkv_a", cfg.q_lora + D, cfg.hidden, L),
        Gemm("wq_b", dep.heads * D, cfg.q_lora, L),
        Gemm("idx_wq_b", cfg.index_heads * cfg.index_dim, cfg.q_lora, csa_layers(cfg)),
        Gemm("wo_b", cfg.hidden, dep.groups * cfg.o_lora, L),
        Gemm("shared_w13", 2 * dep.shared_width, cfg.hidden, L),
        Gemm("shared_w2", cfg.hidden, dep.shared_width, L),
    ]
    if fp8_wo_a:
        out.append(Gemm("wo_a", cfg.o_lora, cfg.heads // cfg.o_groups * D, L * dep.groups))
    return out


def index_logits_bytes(cfg: ModelConfig, seq_lens: list[int]) -> int:
    """fp8_paged_mqa_logits: the e4m3 queries and head weights, every scored key with its scale, the
    logits written up to each length (the rest of the row is left alone)."""
    B, H, Di = len(seq_lens), cfg.index_heads, cfg.index_dim
    return B * H * (Di + FP32) + sum(seq_lens) * (Di + FP32 + FP32)


def hc_prenorm_bytes(cfg: ModelConfig, tokens: int, splits: int) -> int:
    """tf32_hc_prenorm_gemm: the bf16 copies, the fp32 pre-mix weight, the partial outputs."""
    K, N = cfg.hc * cfg.hidden, cfg.hc_mix
    return tokens * K * BF16 + N * K * FP32 + splits * tokens * (N + 1) * FP32


def big_fuse_bytes(cfg: ModelConfig, tokens: int, splits: int) -> int:
    """mhc_pre_big_fuse_with_norm: partials, copies and norm weight in; x, post and comb out."""
    d, hc, N = cfg.hidden, cfg.hc, cfg.hc_mix
    return splits * tokens * (N + 1) * FP32 + tokens * hc * d * BF16 + d * BF16 + tokens * (d * BF16 + (hc + hc * hc) * FP32)


def post_bytes(cfg: ModelConfig, tokens: int) -> int:
    """mhc_post: y and the copies in, the new copies out, post and comb."""
    d, hc = cfg.hidden, cfg.hc
    return tokens * (d * BF16 + 2 * hc * d * BF16 + (hc + hc * hc) * FP32)


def fma_bytes(cfg: ModelConfig, tokens: int, splits: int) -> int:
    """mhc_fused_post_pre_fma: the post step's bytes, the pre-mix weight once, the partials."""
    return post_bytes(cfg, tokens) + cfg.hc_mix * cfg.hc * cfg.hidden * FP32 + splits * tokens * (cfg.hc_mix + 1) * FP32


def expert_slice_bytes(cfg: ModelConfig, dep) -> int:
    """One routed expert's tp slice in MXFP4 with e8m0 scales (w13 and w2)."""
    d, I = cfg.hidden, dep.expert_width
    return 2 * I * (d // 2 + d // 32 * E8M0) + d * (I // 2 + I // 32 * E8M0)


def routed_bytes(cfg: ModelConfig, dep, tokens: int, distinct_experts: int) -> int:
    """The routed experts of `tokens` tokens: every distinct expert's slice, x in, the output out."""
    return distinct_experts * expert_slice_bytes(cfg, dep) + 2 * tokens * cfg.hidden * BF16
