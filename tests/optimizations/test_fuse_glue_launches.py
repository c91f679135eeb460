"""What fuse-glue removes from a step's launches, and whether dsv4-flash at C = 32 then stays under
2,500 launches a step on top of mma-attn and bf16-gemm.

Counted twice, independently of the model's code: on the CPU, the launches per part of the tiny
config's step with and without fuse-glue (tests/workload/launch_count.py), against the fidelity
table's per-part counts; on the H200, the kernels each region holds in a real trace of the
faithful workload (tests/data, read with plain json), applied to the launches per step of the
committed C = 32 profile with mma-attn and bf16-gemm.
"""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from dsv4opt.workload.config import ModelConfig
from tests.helpers import DATA, EVIDENCE_PROFILES
from tests.workload.test_fidelity import expected

TINY = ModelConfig.from_name("dsv4-tiny")
EAGER_TRACE = DATA / "h200-dsv4flash-faithful-l4-c32-eager.trace.json.gz"
PROFILE = EVIDENCE_PROFILES / "embedded-dsv4-flash-c32-ctx8192-mma-attn+bf16-gemm.json"
TARGET = 2500

# Per layer on the CPU, from the fidelity table's accounts: mhc_pre twice 7 (prenorm, pre-mix
# linear, RMS scaling, Sinkhorn, weighted sum 3), of which the last five become one launch; the MoE
# 31, of which the local-expert map (1) and the per-slot path's 19 eager operations become four
# launches (the map, the set-up, the activation, the combine); the scaled add stays.
# Under tensor parallelism (tp4) the MoE is 29 with no local-expert map: its 19 eager operations
# become three launches.
FUSED_PER_LAYER = {"mhc_pre": 2 * (7 - 5 + 1), "moe": 31 - (1 + 19) + 4}
FUSED_PER_LAYER_TP = {**FUSED_PER_LAYER, "moe": 29 - 19 + 3}


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts Triton launches through the CPU interpreter")
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["dp-ep", "tp4"])
def test_fuse_glue_launches_per_part_on_the_tiny_config(monkeypatch, layout):
    from dsv4opt.optimizations.registry import implementations
    from dsv4opt.workload.model import DecodeWorkload
    from tests.conftest import _empty, _empty_like
    from tests.workload.launch_count import count_step

    monkeypatch.setattr(torch, "empty", _empty)
    monkeypatch.setattr(torch, "empty_like", _empty_like)
    layers = 2  # per-layer counts of these parts do not depend on the layer's kind
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.float16, seed=0, layers=layers,
                        impls=implementations(["fuse-glue"]), layout=layout)
    counted = count_step(wl, torch.tensor([3, 9]), monkeypatch)
    fused = FUSED_PER_LAYER if layout == "dp-ep" else FUSED_PER_LAYER_TP
    for part in ("mhc_pre", "moe"):
        assert counted.counts[part] == layers * fused[part], (part, counted.ops[part])
    unchanged = expected(TINY, layout)
    for part in ("attn_norm", "ffn_norm", "qkv", "o_proj", "mhc_post"):
        assert counted.counts[part] == layers * unchanged[part] // TINY.layers, part


def _region_sizes() -> dict[str, list[int]]:
    """Kernels each region holds in the H200 eager step (4 layers), found by their neighbours."""
    events = json.load(gzip.open(EAGER_TRACE))["traceEvents"]
    names = [e["name"] for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])]

    def where(part: str) -> list[int]:
        return [i for i, n in enumerate(names) if part in n]

    def nearest(part: str, i: int, step: int) -> int:
        while part not in names[i]:
            i += step
        return i

    gemv = where("_mxfp4_slot_gemv_kernel")
    first, second = gemv[0::2], gemv[1::2]
    return {
        # from the pre-mix linear's split-K reduction to the next RMS norm, around each Sinkhorn kernel
        "hc_split_sum": [nearest("_rms_norm_kernel", s, 1) - nearest("splitKreduce_kernel", s, -1) - 1
                         for s in where("_hc_split_sinkhorn_kernel")],
        "moe_route": [g - nearest("_moe_gate_kernel", g, -1) - 1 for g in first],
        "moe_act": [b - a - 1 for a, b in zip(first, second)],
        "moe_combine": [nearest("_hc_post_kernel", g, 1) - g - 1 for g in second],
    }


# Launches each region keeps after fuse-glue: the map and the set-up before the first GEMV (the map
# is the model's, outside the routed-experts slot), the combine and the scaled add to the shared
# expert's output after the second.
FUSED_REGION = {"hc_split_sum": 1, "moe_route": 2, "moe_act": 1, "moe_combine": 2}


def test_the_regions_hold_what_the_fidelity_table_says_on_the_h200():
    sizes = _region_sizes()
    layers = 4
    assert sizes["hc_split_sum"] == [5] * (2 * layers)
    # the gather's two casts to int64 launch on a GPU and not in the CPU count: 5 there, 7 here
    assert sizes["moe_route"] == [7] * layers
    assert sizes["moe_act"] == [8] * layers
    assert sizes["moe_combine"] == [8] * layers


def test_fuse_glue_brings_dsv4_flash_under_2500_launches_a_step():
    sizes = _region_sizes()
    removed_per_layer = sum(sizes[r][0] - FUSED_REGION[r] for r in ("moe_route", "moe_act", "moe_combine")) + \
        2 * (sizes["hc_split_sum"][0] - FUSED_REGION["hc_split_sum"])
    assert removed_per_layer == 26
    before = json.loads(PROFILE.read_text())["steps"]["launches_per_step"]
    layers = ModelConfig.from_name("dsv4-flash").layers
    after = before - layers * removed_per_layer
    assert after <= TARGET, (before, after)
