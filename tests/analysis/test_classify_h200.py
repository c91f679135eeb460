"""Kernel names from our own H200 runs land where an inference engineer would put them."""

from __future__ import annotations

import gzip
import json

import pytest

from dsv4opt.analysis.classify import classify
from tests.helpers import DATA

GRAPH_TRACE = DATA / "h200-dsv4flash-l3-c4-graph.trace.json.gz"


def _kernel_names() -> set[str]:
    with gzip.open(GRAPH_TRACE, "rt") as f:
        return {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"}


def test_cutlass_grouped_gemm_is_moe_even_when_demangling_falls_back():
    # torch._scaled_grouped_mm's CUTLASS kernel: mangled, with GroupProblemShape in its template
    grouped = [n for n in _kernel_names() if n.startswith("_ZN7cutlass13device_kernel") and "GroupProblemShape" in n]
    assert grouped, "fixture lost its grouped GEMM"
    assert {classify(n) for n in grouped} == {"moe"}


@pytest.mark.parametrize(
    "name,category",
    [
        ("_simt_sparse_decode_kernel", "attention"),
        ("_mma_sparse_decode_kernel", "attention"),
        ("_attn_combine_splits_kernel", "attention"),
        ("_indexer_score_mm_kernel", "gemm_tc"),
        ("_premix_mm_kernel", "gemm_tc"),
        ("nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT", "gemm_tc"),
        ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__51a_cublas", "gemm_fp32_simt"),
        ("Kernel2<cutlass_80_simt_sgemm_64x64_8x5_tn_align1>", "gemm_fp32_simt"),
    ],
    ids=["baseline-attn", "mma-attn", "mma-combine", "bf16-indexer", "bf16-premix", "fp8-nvjet", "fp32-xmma-ffma", "fp32-simt-sgemm"],
)
def test_dsv4opt_and_cublas_kernels(name, category):
    assert classify(name) == category
