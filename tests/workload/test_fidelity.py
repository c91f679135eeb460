"""What one decode step launches, part by part, against SGLang's sm_120 path.

The expected counts are SGLang's per-layer launches at sgl-project/sglang@37ef295c7 (counted from
its source, docs/workload.md) with the differences the workload makes on purpose written next to
them. Counted on the tiny config under the interpreter:
a Triton kernel or an ATen operator that launches a GPU kernel counts one (launch_count.py).
"""

import pytest
import torch

from dsv4opt.workload.config import CSA, HCA, WINDOW, ModelConfig
from dsv4opt.workload.layout import Layout
from dsv4opt.workload.model import DecodeWorkload
from tests.workload.launch_count import LaunchCounter, count_step

TINY = ModelConfig.from_name("dsv4-tiny")

# part -> launches per layer, by layer kind (an int: every kind)
PER_LAYER = {
    # hc_pre twice: the compiled hc_pre_torch_impl (5 Inductor kernels in SGLang, our one Triton
    # kernel + the fp32 F.linear + the RMS scaling), the TileLang Sinkhorn, the weighted sum (3).
    "mhc_pre": 2 * 7,
    "attn_norm": 1,
    "ffn_norm": 1,
    # wqkv_a (quant + block-FP8 GEMM), q_norm, wq_b (2), fused_q_norm_rope, kv norm+rope+store
    "qkv": 7,
    # weights_proj, wq_b (2), q rope+Hadamard+quant, the torch logits fallback (15), top-k (1)
    "indexer": {CSA: 20},
    # per compressor: bf16 GEMM with fp32 out, compress_forward, norm+rope+store; CSA has two
    "compress": {CSA: 6, HCA: 3},
    # window cache call (zeros, full, kernel), compressed cache call (3), merge (22), sink (9),
    # inverse RoPE (1); window-only layers skip the second call and the merge
    "attn": {WINDOW: 13, CSA: 38, HCA: 38},
    # grouped o_a as a bf16 bmm, the copy flatten makes of its permuted output, wo_b (2)
    "o_proj": 4,
    "mhc_post": 2,
    # the all-gather's stand-in (a copy), shared expert (5), router GEMM, gate, local-expert map,
    # the per-slot MXFP4 path (2 GEMV kernels + 19 eager), the scaled add to the shared output;
    # SGLang adds a reduce-scatter, which one GPU does not run
    "moe": 31,
}
# Tensor parallelism (tp4, tp8) changes two parts: no all-gather and no local-expert map in the MoE
# (SGLang builds the map only with EP, token_dispatcher/standard.py:169-212); the all-reduces after
# wo_b and after the MoE are SGLang's, not run by one rank alone. q is written into the padded
# buffer by the norm+rope kernel itself (q_out), so padding adds no launch.
TP_PER_LAYER = {**PER_LAYER, "moe": 29}
# the collectives SGLang adds per layer, which one rank alone does not run
SGLANG_COLLECTIVES = {"dp-ep": {"moe": 1}, "tp4": {"o_proj": 1, "moe": 1}}


def expected(cfg: ModelConfig, layout: str = "dp-ep") -> dict[str, int]:
    kinds = [cfg.layer_kind(i) for i in range(cfg.layers)]
    table = PER_LAYER if layout == "dp-ep" else TP_PER_LAYER
    if Layout.from_name(layout).deploy(cfg).groups == 1:  # one group's o_a output needs no copy to flatten
        table = {**table, "o_proj": table["o_proj"] - 1}
    out = {}
    for part, per in table.items():
        out[part] = sum(per if isinstance(per, int) else per.get(kind, 0) for kind in kinds)
    return out


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts Triton launches through the CPU interpreter")
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tp4", "dp-ep"])
def test_launches_per_part_match_sglangs_sm120_path(monkeypatch, layout):
    from tests.conftest import _empty, _empty_like

    # the NaN poison (tests/conftest.py) fills every new tensor: a launch the model does not make
    monkeypatch.setattr(torch, "empty", _empty)
    monkeypatch.setattr(torch, "empty_like", _empty_like)
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.bfloat16, seed=0, layout=layout)
    counted = count_step(wl, torch.tensor([3, 9]), monkeypatch)
    want = expected(TINY, layout)
    got = {part: counted.counts[part] for part in want}
    assert got == want, {p: (got[p], want[p], counted.ops[p][: got[p] // TINY.layers + 3]) for p in want if got[p] != want[p]}
    # the per-step parts: embedding and index metadata, the head
    assert counted.counts["mhc_head"] == 10 and counted.counts["lm_head"] == 3


def test_expected_table_totals_near_sglangs_per_layer_count():
    """SGLang's sm_120 path launches about 113 kernels a layer on average (4,900 a step)."""
    flash = ModelConfig.from_name("dsv4-flash")
    per_layer = sum(expected(flash).values()) / flash.layers
    assert 0.8 * 113 <= per_layer <= 1.2 * 113, per_layer


def test_tp4_table_totals_near_sglangs_per_layer_count():
    """Under tp4 SGLang's layer launches two fewer (no all-gather, no local map) and one more (a
    second all-reduce): about 112 a layer."""
    flash = ModelConfig.from_name("dsv4-flash")
    ours = sum(expected(flash, "tp4").values()) / flash.layers
    sglang = ours + sum(SGLANG_COLLECTIVES["tp4"].values())
    assert 0.8 * 112 <= sglang <= 1.2 * 112, sglang


# ---- SGLang 0.5.23's Hopper path (dsv4opt/workload/paths.py), counted from the 0.5.23 wheel ----------
# part -> launches per layer; SGLang's accounts and file:line in docs/workload.md ("The Hopper path").
HOPPER_PER_LAYER = {
    # per sublayer: DeepGEMM's tf32 pre-norm GEMM, then TileLang's big fuse with the RMSNorm
    # (mhc.py:1733-1832, more than 32 tokens; up to 32 the post joins the GEMM: one launch fewer)
    "mhc_pre": 2 * 2,
    "attn_norm": 0,
    "ffn_norm": 0,
    "qkv": 7,
    # weights_proj, wq_b (2), q rope+Hadamard+quant, DeepGEMM's FP8 logits, top-k
    "indexer": {CSA: 6},
    "compress": {CSA: 6, HCA: 3},
    # FlashMLA's split-KV kernel and its combine (counted from source: the CPU runs the sm_120
    # kernel in its place, quietly), the inverse RoPE; its scheduler metadata once a step per
    # compress ratio (three a step, not per layer)
    "attn": 3,
    # wo_a a bf16 einsum (SGLang turns its FP8 GEMM off on sm_90 unless the variable is set:
    # docs/production-kernels.md), wo_b (2)
    "o_proj": 3,
    "mhc_post": 2,
    # shared expert (5), router GEMM, gate, the grouped kernel's 4 launches (Marlin: align, workspace
    # zeros, two GEMMs, the clamped SwiGLU, the top-k sum), the add to the shared output
    "moe": 12,
}
FLASHMLA_LAUNCHES = 2


def hopper_expected(cfg: ModelConfig) -> dict[str, int]:
    table = HOPPER_PER_LAYER
    kinds = [cfg.layer_kind(i) for i in range(cfg.layers)]
    return {part: sum(per if isinstance(per, int) else per.get(kind, 0) for kind in kinds) for part, per in table.items()}


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts Triton launches through the CPU interpreter")
@pytest.mark.slow
def test_launches_per_part_match_sglang_0523_hopper_path(monkeypatch):
    from tests.conftest import _empty, _empty_like

    monkeypatch.setattr(torch, "empty", _empty)
    monkeypatch.setattr(torch, "empty_like", _empty_like)
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.float16, seed=0, sglang="0.5.23")
    counter = LaunchCounter()

    def flashmla_counted(q, *args):
        """FlashMLA's launches counted from source; what it returns made without a kernel to count."""
        counter.counts[counter.part] += FLASHMLA_LAUNCHES
        counter.ops[counter.part] += ["flashmla"] * FLASHMLA_LAUNCHES
        counter.quiet += 1
        try:
            return q.new_zeros(q.shape), q.new_zeros(q.shape[:2], dtype=torch.float32)
        finally:
            counter.quiet -= 1

    wl.impls["attention"] = flashmla_counted
    wl.step(torch.tensor([3, 9]))  # the grouped kernel repacks its weights once, on the first call
    counter.counts.clear()
    counter.ops.clear()
    counted = count_step(wl, torch.tensor([3, 9]), monkeypatch, counter)
    want = hopper_expected(TINY)
    got = {part: counted.counts[part] for part in want}
    assert got == want, {p: (got[p], want[p], counted.ops[p][: got[p] // TINY.layers + 3]) for p in want if got[p] != want[p]}
