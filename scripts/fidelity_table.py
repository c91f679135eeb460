"""Launches per layer, part by part, of a committed embedded profile against the SGLang path it reproduces.

    python scripts/fidelity_table.py evidence/h200/profiles/embedded-dsv4-flash-c32-ctx8192-baseline.json

SGLang's column is counted from its source at sgl-project/sglang@37ef295c7 (docs/workload.md), for the
profile's layout: the o_proj and MoE rows differ between tensor parallelism (tp4, tp8: all-reduces, no
gather or expert map) and DP attention + EP8 without an all-to-all backend (dp-ep; older profiles).
Ours is read from the profile: launches of the part's record_function range per step, over the
config's layers (one rank alone runs no collective).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4opt.analysis.profile import Profile  # noqa: E402
from dsv4opt.workload.paths import ran_fp8_wo_a  # noqa: E402

# part(s) of ours -> (SGLang sm_120 launches per layer, averaged over the 43 layers; what they are)
SGLANG = {
    ("mhc_pre",): (18, "compiled hc_pre_torch_impl (5) + TileLang Sinkhorn + weighted sum (3), twice"),
    ("mhc_post",): (2, "TileLang mhc_post, twice"),
    ("attn_norm", "ffn_norm"): (2, "sgl_kernel rmsnorm, twice"),
    ("qkv",): (7, "wqkv_a (2), q_norm, wq_b (2), fused_q_norm_rope, kv norm+rope+FP8 store"),
    ("compress",): (4.3, "3 per compressor: 6 on CSA layers (core + indexer), 3 on HCA"),
    ("indexer",): (9.8, "20 per CSA layer: weights_proj, wq_b (2), q rope+Hadamard+quant, torch logits (15), topk_transform_512"),
    ("attn",): (36.9, "38 on compressed layers (2 x 3 + merge 22 + sink 9 + inverse RoPE), 13 on window-only"),
    ("o_proj",): (4, "o_a bmm, the copy flattening its output, wo_b (2)"),
    ("moe",): (32, "all-gather, shared expert (5), router, gate, local map, per-slot MXFP4 path (21), add, reduce-scatter"),
}
# what tensor parallelism changes (deepseek_v4.py:439-448, deepseek_v2.py:948-953; standard.py:169-212)
SGLANG_TP = {
    **SGLANG,
    ("o_proj",): (5, "o_a bmm, the copy flattening its output, wo_b (2), all-reduce"),
    ("moe",): (30, "shared expert (5), router, gate, per-slot MXFP4 path (21), add, all-reduce"),
}


# SGLang 0.5.23 on Hopper under tp4 (its PyPI wheel; docs/workload.md "The Hopper path"), more than
# 32 tokens: per boundary mhc_post, DeepGEMM's tf32 pre-norm GEMM and the big fuse with the norm
# (kernels/ops/layernorm/mhc.py:1733-1832; up to 32 tokens the post and the GEMM are one launch)
SGLANG_HOPPER = {
    ("mhc_pre",): (4, "DeepGEMM tf32_hc_prenorm_gemm + TileLang mhc_pre_big_fuse_with_norm, twice"),
    ("mhc_post",): (2, "TileLang mhc_post, twice (joined with the GEMM up to 32 tokens)"),
    ("attn_norm", "ffn_norm"): (0, "in the big fuse"),
    ("qkv",): (7, "wqkv_a (2), q_norm, wq_b (2), fused_q_norm_rope, kv norm+rope+FP8 store"),
    ("compress",): (4.3, "3 per compressor: 6 on CSA layers (core + indexer), 3 on HCA"),
    ("indexer",): (2.9, "6 per CSA layer: weights_proj, wq_b (2), q rope+Hadamard+quant, DeepGEMM fp8_paged_mqa_logits, top-k"),
    ("attn",): (3, "FlashMLA split-KV + combine, inverse RoPE (its scheduler metadata once a step per compress ratio)"),
    ("o_proj",): (5, "per-token-group FP8 quant, DeepGEMM fp8_einsum, wo_b (2), all-reduce"),
    ("moe",): (16, "shared expert (5), router, gate, Marlin MoE (align, workspace zeros, 2 GEMMs, SwiGLU, top-k sum), add, all-reduce"),
}


# with wo_a in bf16, as SGLang 0.5.23 runs it on sm_90 unless SGLANG_OPT_FP8_WO_A_GEMM is set
# explicitly (docs/production-kernels.md); profiles from before the workload followed it ran FP8 wo_a
SGLANG_HOPPER_BF16_WO_A = {
    **SGLANG_HOPPER,
    ("o_proj",): (4, "o_a bmm (bf16), wo_b (2), all-reduce"),
}


def main(path: str) -> None:
    prof = Profile.load(path)
    steps = prof.steps["count"]
    layers = prof.meta["layers"]
    parts = {p.part: p for p in prof.parts or []}
    layout = prof.meta.get("layout") or "dp-ep"
    hopper = prof.meta.get("sglang") == "0.5.23"
    if hopper:
        table = SGLANG_HOPPER if ran_fp8_wo_a(prof.meta) else SGLANG_HOPPER_BF16_WO_A
    else:
        table = SGLANG if layout == "dp-ep" else SGLANG_TP
    family = "SGLang 0.5.23 Hopper" if hopper else "SGLang sm_120"
    print(f"From `{path}` ({prof.meta['device']}, layout {layout}, C = {prof.meta['concurrency']}, context "
          f"{prof.meta['context']}, commit {prof.meta.get('commit')}): launches per step "
          f"{prof.steps['launches_per_step']:.0f}.\n")
    print(f"| part | ours (H200, per layer) | {family} (per layer) | ours / SGLang | SGLang's launches |")
    print("|---|---:|---:|---:|---|")
    total_ours = total_sgl = 0.0
    for names, (sgl, what) in table.items():
        ours = sum(parts[n].count for n in names if n in parts) / steps / layers
        total_ours += ours
        total_sgl += sgl
        ratio = f"{ours / sgl:.2f}" if sgl else "-"
        print(f"| {' + '.join(names)} | {ours:.1f} | {sgl:g} | {ratio} | {what} |")
    per_step = sum(parts[n].count for n in ("embed", "mhc_head", "lm_head") if n in parts) / steps
    print(f"| **per layer** | **{total_ours:.1f}** | **{total_sgl:.0f}** | {total_ours / total_sgl:.2f} | |")
    print(f"| per step, outside the layers (embedding and index metadata, head) | {per_step:.0f} | | | |")


if __name__ == "__main__":
    main(sys.argv[1])
