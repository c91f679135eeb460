"""The step's bytes floor (dsv4opt/workload/floor.py) against what a built workload holds and reads."""

from __future__ import annotations

import pytest
import torch

from dsv4opt.workload.config import ModelConfig
from dsv4opt.workload.floor import experts_touched, step_floor
from dsv4opt.workload.model import DecodeWorkload

TINY = ModelConfig.from_name("dsv4-tiny")
DENSE = ("wqkv_a", "wq_b", "wo_a", "wo_b", "shared_w13", "shared_w2", "router", "hc_attn_fn", "hc_ffn_fn",
         "idx_wq_b", "idx_weights_proj", "comp_wkv_gate", "idx_wkv_gate")


def _nbytes(v) -> int:
    return sum(_nbytes(x) for x in v) if isinstance(v, list) else v.nbytes


@pytest.mark.parametrize("sglang", ["0.5.14", "0.5.23"])
def test_dense_weights_are_what_the_workload_holds(sglang, torch_path):
    """Counted from the config, equal to the bytes of the projections a built workload holds (its
    bf16 weights as bf16, its block-FP8 ones with their scales; wo_a per the path)."""
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.bfloat16, sglang=sglang)
    held = sum(_nbytes(layer.w[name]) for layer in wl.layers for name in DENSE if name in layer.w)
    floor = step_floor(wl.cfg, "tp4", wl.contexts.tolist(), fp8_wo_a=wl.path.fp8_wo_a)
    assert floor.parts["dense weights"] == held


def test_kv_rows_follow_the_contexts():
    """One request of 40 tokens: window 8 rows, CSA top-6 of 10 entries and 10 index keys on each CSA
    layer, 2 HCA entries (16 a entry) on each HCA layer."""
    kinds = [TINY.layer_kind(i) for i in range(TINY.layers)]
    csa, hca = kinds.count("csa"), kinds.count("hca")
    want = TINY.layers * 8 * 584 + csa * (6 * 584 + 10 * 132) + hca * 2 * 584
    assert step_floor(TINY, "tp4", [40]).parts["KV and index keys"] == want


def test_indexer_rows_are_each_requests_own_entries():
    """Scores written over each request's entries and read back by the top-k, 4 B each way, on every
    CSA layer: SGLang's graph-wide logits tensor is allocated, not moved (docs/optimizations/indexer-topk.md)."""
    # contexts 40, 7, 300 at ratio 4: 10, 2 and 75 entries, 87 scores of 4 B written and read back on
    # each of the tiny config's 2 CSA layers: 2 * 87 * 4 * 2 B
    assert step_floor(TINY, "tp4", [40, 7, 300]).parts["indexer logit rows"] == 1392


def test_experts_touched_from_one_token_to_saturation():
    assert experts_touched(TINY, 1) == pytest.approx(TINY.experts_per_token)
    assert experts_touched(TINY, 10_000) == pytest.approx(TINY.experts)
    assert experts_touched(TINY, 4) < 4 * TINY.experts_per_token  # tokens share experts
