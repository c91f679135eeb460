"""The baseline: SGLang's decode path, reproduced with our own kernels (see docs/workload.md).

The sm_120 path of SGLang 0.5.14 (the default, `IMPLEMENTATIONS`):

- attention: `flash_mla_sparse_decode_triton`: the CUDA-core Triton kernel over the window cache,
  then the compressed cache, eager LSE merge and sink (dsv4opt/workload/attention/sm120.py);
- indexer logits: `fp8_paged_mqa_logits_torch_sm120`: keys dequantised to float32, float32
  `torch.bmm` (dsv4opt/workload/kernels/indexer.py);
- indexer top-k: the `indexer_logits` slot over the page table's width, then `topk_transform`
  (SGLang's two calls, dsv4/indexer.py:1078-1099; both paths);
- hyper-connection pre-mix: float32 `F.linear` (deepseek_v4.py:1246-1252, inside the compiled
  `hc_pre_torch_impl`; a cuBLAS FP32 SIMT GEMM);
- routed experts: `mxfp4_moe_forward_triton`: two per-slot MXFP4 GEMV kernels over every
  (token, expert) slot of the gathered tokens and SGLang's eager glue before, between and after them;
- the glue: SGLang's eager torch operations, region by region (dsv4opt/workload/glue.py): the
  hyper-connection split and sum, the local-expert map, the per-slot path's set-up, activation and
  combine;
- regions: each block as written, op by op (SGLang's eager glue).

The Hopper path of SGLang 0.5.23 (`hopper_0523(kernels)`; dsv4opt/workload/paths.py), SGLang's own
kernel where `kernels` (production/choice.py) says it runs here, else the stand-in:

- attention: FlashMLA's sparse FP8 decode from sgl-flash-mla, called itself (attention/flashmla.py);
- indexer scores and top-k: DeepGEMM's `fp8_paged_mqa_logits` with clean_logits off (production/
  deepgemm.py), its schedule once a step, then the top-k over each request's own entries; stand-in:
  e4m3 operands on FP8 tensor cores (kernels/indexer_tc.py), whose rows are -inf-filled to the graph's
  width as the `indexer_logits` contract asks (SGLang's are not: its cost overstates SGLang's);
- routed experts: Marlin's W4A16 grouped MoE (`fused_marlin_moe`, the recipe's
  `--moe-runner-backend marlin`; production/marlin.py); stand-in: the grouped MXFP4 kernel
  (kernels/grouped_moe/kernel.py);
- the hyper-connection pre step is fused in the model itself (no pre-mix slot is called), and the
  dense FP8 linears are chosen where the model builds them (DeepGEMM's `fp8_gemm_nt` or the
  block-FP8 Triton GEMM).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4opt.workload import glue
from dsv4opt.workload.attention.flashmla import sparse_decode_flashmla
from dsv4opt.workload.attention.sm120 import sparse_decode_sm120
from dsv4opt.workload.kernels.grouped_moe import grouped_routed_experts
from dsv4opt.workload.kernels.indexer import index_logits_torch, topk_transform
from dsv4opt.workload.kernels.indexer_tc import index_logits_tc
from dsv4opt.workload.kernels.moe import mxfp4_slot_gemv
from dsv4opt.workload.weights import Mxfp4Experts


def hc_premix_fp32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [T, n*hidden] fp32, weight: [24, n*hidden] fp32 -> [T, 24] fp32."""
    return F.linear(x.float(), weight.float())


def routed_experts_sm120(x, local_ids, gates, w13: Mxfp4Experts, w2: Mxfp4Experts, limit: float, scale: float):
    """SGLang's `mxfp4_moe_forward_triton` (mxfp4_moe_sm120_triton.py:327-454): per-slot GEMVs and eager glue.

    x: [M, d]; local_ids: [M, k] int32 local expert per slot (-1: not on this rank); gates: [M, k] fp32.
    Returns [M, d] in x's dtype, already multiplied by `scale` (SGLang's sm_120 path then adds it to
    the shared expert with alpha = scale once more).
    """
    M, k = local_ids.shape
    experts, rows, invalid = glue.moe_slots_eager(local_ids)
    inter = mxfp4_slot_gemv(x, rows, experts, w13.packed, w13.scales)
    act = glue.moe_act_eager(inter, limit)
    slots = torch.arange(M * k, device=x.device, dtype=torch.int32)
    down = mxfp4_slot_gemv(act, slots, experts, w2.packed, w2.scales)
    return glue.moe_combine_eager(down, invalid, gates, scale)


def indexer_topk_two_pass(q8, weights, cache, seq_lens, page_table, base, topk: int, logits):
    """The baseline `indexer_topk` slot: `logits` (the step's indexer_logits implementation) writes
    [B, page_table width] fp32 scores, then topk_transform selects from each request's own."""
    scores = logits(q8, weights, cache, seq_lens, page_table, page_table.shape[1] * cache.page_size)
    return topk_transform(scores, seq_lens, base, topk)


def as_written(block, impls):
    """The baseline `regions` slot: the block itself."""
    return block


def index_logits_fp8(q8, weights, cache, seq_lens, page_table, max_len):
    """The `indexer_logits` slot on FP8 tensor cores: the Hopper path's DeepGEMM stand-in."""
    return index_logits_tc(q8, weights, cache, seq_lens, page_table, max_len, operands="fp8")


def index_logits_deepgemm(q8, weights, cache, seq_lens, page_table, max_len):
    """The `indexer_logits` slot through DeepGEMM's `fp8_paged_mqa_logits`, its schedule made by the
    step's first CSA layer and reused by the others (SGLang makes it once a step with the metadata)."""
    from dsv4opt.workload.production import deepgemm

    schedule = deepgemm.step_schedule(seq_lens, cache.page_size)
    return deepgemm.index_logits(q8, weights, cache, seq_lens, page_table, max_len, schedule)


def indexer_topk_deepgemm(q8, weights, cache, seq_lens, page_table, base, topk: int, logits=None):
    """The `indexer_topk` slot as SGLang 0.5.23 runs it on Hopper: DeepGEMM's `fp8_paged_mqa_logits`
    with clean_logits off (each row written over the request's own entries only; its graph-wide rest
    left as it was: indexer.py:1089-1099), then the top-k over each request's first seq_lens entries
    (topk_transform's kernel reads no further on a GPU). `logits` is not called: the scores are
    DeepGEMM's."""
    from dsv4opt.workload.production import deepgemm

    schedule = deepgemm.step_schedule(seq_lens, cache.page_size)
    scores = deepgemm.paged_mqa_logits(q8, weights, cache, seq_lens, page_table,
                                       page_table.shape[1] * cache.page_size, schedule)
    return topk_transform(scores, seq_lens, base, topk)


def routed_experts_marlin(x, local_ids, gates, w13: Mxfp4Experts, w2: Mxfp4Experts, limit: float, scale: float):
    """The `routed_experts` slot through Marlin's `moe_wna16_marlin_gemm` on the experts' Marlin copies
    (made when the model is built), every id local as under the recipe's tensor parallelism."""
    from dsv4opt.workload.production import marlin

    return marlin.routed_experts(x, local_ids, gates, w13.marlin, w2.marlin, limit, scale)


def hopper_0523(kernels=None) -> dict:
    """The Hopper path's slot implementations: SGLang's own kernels where `kernels`
    (production.choice.KernelChoice; None: none of them) says they run, the stand-ins elsewhere."""
    real_indexer = kernels is not None and kernels.deep_gemm
    real_moe = kernels is not None and kernels.marlin
    return {**IMPLEMENTATIONS, "attention": sparse_decode_flashmla,
            "indexer_logits": index_logits_deepgemm if real_indexer else index_logits_fp8,
            "indexer_topk": indexer_topk_deepgemm if real_indexer else indexer_topk_two_pass,
            "routed_experts": routed_experts_marlin if real_moe else grouped_routed_experts}


IMPLEMENTATIONS = {
    "attention": sparse_decode_sm120,
    "indexer_logits": index_logits_torch,
    "indexer_topk": indexer_topk_two_pass,
    "hc_premix": hc_premix_fp32,
    "routed_experts": routed_experts_sm120,
    "regions": as_written,
    "hc_split_sum": glue.hc_split_sum_eager,
    "moe_local": glue.moe_local_eager,
}
