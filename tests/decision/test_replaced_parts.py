"""recommend bounds an optimisation by the workload parts its slots replace, on embedded profiles
whose parts account for the time; elsewhere by its target category. Hand-made profiles with round
numbers: every expected bound is 1 / (1 - share) worked out from the table below."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from dsv4opt.analysis.parts import NO_PART, UNMATCHED_REPLAY
from dsv4opt.analysis.profile import PartRow
from dsv4opt.decision.recommend import recommend
from dsv4opt.optimizations.registry import OPTIMIZATIONS
from dsv4opt.report.decision import print_recommendation
from tests.decision.profiles import make_profile

# The campaign's shape after mma-attn, in round numbers (µs over 10 steps, total 10,000): the indexer's
# torch fallback is a small FP32 GEMM and a lot of copies and elementwise launches filed elsewhere.
KERNELS = [
    ("_mxfp4_slot_gemv_kernel", "moe", 430, 2500.0),  # moe part
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_ffma", "gemm_fp32_simt", 430, 1000.0),  # indexer part
    ("vectorized_gather_kernel<16, long>", "copy", 4300, 3000.0),  # indexer part
    ("vectorized_elementwise_kernel<4, ...>", "elementwise", 8600, 2500.0),  # indexer part
    ("mma_sparse_decode_kernel", "attention", 430, 1000.0),  # attn part
]
PARTS = {"moe": 2500.0, "indexer": 6500.0, "attn": 1000.0}  # sums to the 10,000 above
EMBEDDED = {"target": "embedded", "config": "dsv4-flash", "concurrency": 32, "optimizations": ["mma-attn"]}


def profile(parts: dict[str, float] | None = PARTS, meta: dict | None = None):
    prof = make_profile(KERNELS, meta=EMBEDDED if meta is None else meta)
    if parts is not None:
        total = sum(parts.values())
        prof.parts = [PartRow(part=p, count=1, total_us=t, share=t / total) for p, t in parts.items()]
    return prof


def by_name(prof):
    rec = recommend(prof)
    return rec, {c.name: c for c in rec.candidates}


def test_the_bound_counts_every_launch_of_the_parts_a_slot_replaces():
    rec, cands = by_name(profile())
    gemm, moe = cands["bf16-gemm"], cands["grouped-moe"]
    assert gemm.share == pytest.approx(0.65) and gemm.share_of == "parts indexer, mhc_pre"
    assert gemm.amdahl_bound == pytest.approx(1 / 0.35)
    assert moe.share == pytest.approx(0.25) and moe.share_of == "parts moe"
    assert moe.amdahl_bound == pytest.approx(1 / 0.75)
    # the category rule would have ranked them the other way: FP32 GEMM 10% against MoE 25%
    assert rec.chosen is gemm
    assert "the indexer and mhc_pre parts is 65.0% of GPU time" in " ".join(rec.explanation)


def test_a_kernel_speedup_on_record_is_not_applied_to_a_part():
    # mma-attn has one on record (122.9x at B = 32); the part also holds glue the slot removes
    # with the kernel, so the bound is the part's share taking no time
    _, cands = by_name(profile())
    mma = cands["mma-attn"]
    assert mma.share == pytest.approx(0.10) and mma.amdahl_bound == pytest.approx(1 / 0.90)
    assert mma.kernel_speedup is None and "parts it replaces take no time" in mma.speedup_source


@pytest.mark.parametrize("outside,rule", [(0.0, "parts"), (0.019, "parts"), (0.02, "category"), (0.30, "category")],
                         ids=["none-outside", "just-under-2pct", "2pct", "compiled-step"])
@pytest.mark.parametrize("where", [NO_PART, UNMATCHED_REPLAY], ids=["no-annotation", "unmatched-replay"])
def test_parts_bound_only_when_they_account_for_the_time(outside, rule, where):
    scale = (1 - outside) / sum(PARTS.values())
    parts = {p: t * scale for p, t in PARTS.items()} | {where: outside}
    _, cands = by_name(profile(parts))
    gemm = cands["bf16-gemm"]
    if rule == "parts":
        assert gemm.share == pytest.approx(0.65 * (1 - outside)) and gemm.share_of == "parts indexer, mhc_pre"
    else:  # the FP32 SIMT GEMM category: 1,000 of 10,000 µs
        assert gemm.share == pytest.approx(0.10) and gemm.share_of == "FP32 SIMT GEMM"


@pytest.mark.parametrize("meta,parts", [
    ({**EMBEDDED, "target": "trace"}, PARTS),  # a trace file: its ranges are not known to be the workload's parts
    ({**EMBEDDED, "target": "sglang"}, PARTS),
    (EMBEDDED, None),  # an embedded profile from before parts were recorded
], ids=["trace-file", "sglang", "no-parts"])
def test_elsewhere_the_category_rule_stands(meta, parts):
    _, cands = by_name(profile(parts, meta))
    gemm = cands["bf16-gemm"]
    assert gemm.share == pytest.approx(0.10) and gemm.share_of == "FP32 SIMT GEMM"


def test_glue_optimisations_keep_the_glue_rule():
    _, cands = by_name(profile())
    assert cands["torch-compile"].share_of == "eager glue"
    # 3,000 copy + 2,500 elementwise µs of 10,000: the glue categories, not the mhc_pre and moe parts
    assert cands["torch-compile"].share == pytest.approx(0.55)
    assert not cands["fuse-glue"].share_of.startswith("parts")


def test_registered_parts_are_parts_the_workload_records():
    from dsv4opt.workload.model import PARTS as RECORDED

    for opt in OPTIMIZATIONS.values():
        assert set(opt.parts) <= set(RECORDED), opt.name
    assert OPTIMIZATIONS["bf16-gemm"].parts == ("indexer", "mhc_pre")
    assert OPTIMIZATIONS["torch-compile"].parts == ()


def test_the_table_says_what_each_share_is_of():
    out = io.StringIO()
    print_recommendation(recommend(profile()), Console(file=out, width=220, force_terminal=False))
    text = out.getvalue()
    assert "share of" in text and "parts indexer, mhc_pre" in text and "parts moe" in text


# The Hopper path's shape: most glue time is the workload's own Triton kernels, which torch-compile
# keeps opaque (its custom ops), and a little is eager torch.
OWN_GLUE = [
    ("_moe_up_kernel", "moe", 430, 4000.0),
    ("_index_q_kernel", "copy", 430, 2000.0),  # own Triton: opaque under torch-compile
    ("_hc_pre_big_fuse_kernel", "reduction", 860, 3000.0),  # own Triton: opaque
    ("vectorized_elementwise_kernel<4, ...>", "elementwise", 860, 1000.0),  # eager torch
]


@pytest.mark.parametrize("target,share", [("embedded", 0.10), ("sglang", 0.60)])
def test_torch_compile_is_bound_by_the_glue_eager_torch_launches_on_embedded_profiles(target, share):
    """On an embedded profile the workload's `_name_kernel` Triton glue is not torch-compile's to fuse:
    10% eager glue of 60% -> bound 1/0.9; an SGLang trace's kernels are not told apart (all 60%)."""
    rec = recommend(make_profile(OWN_GLUE, meta={**EMBEDDED, "target": target}))
    tc = {c.name: c for c in rec.candidates}["torch-compile"]
    assert tc.share == pytest.approx(share) and tc.amdahl_bound == pytest.approx(1 / (1 - share))


def test_the_hopper_paths_moe_says_it_is_upstream():
    """On the 0.5.23 Hopper path the MoE is already a grouped W4A16 kernel: the largest category names
    the version table's reason, where the sm_120 path's profile says grouped-moe finds no slot GEMV."""
    hopper = recommend(make_profile(OWN_GLUE, meta={**EMBEDDED, "sglang": "0.5.23"}))
    sm120 = recommend(make_profile(OWN_GLUE, meta=EMBEDDED))
    assert "grouped-moe: already upstream in SGLang 0.5.23" in " ".join(hopper.explanation)
    assert "grouped-moe replaces slot_gemv kernels" in " ".join(sm120.explanation)
