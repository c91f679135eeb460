import math

import pytest

from dsv4opt.decision.diagnose import diagnose
from dsv4opt.decision.fragmentation import fragmentation
from dsv4opt.decision.recommend import amdahl, recommend
from tests.decision.profiles import amdahl_of, fuse_glue_on_record, make_profile, story_after_attention


@pytest.mark.parametrize(
    "share,speedup,expected",
    [(0.5, None, 2.0), (0.5, 2.0, 1 / (0.5 + 0.25)), (0.0, 10.0, 1.0), (0.2, 1.0, 1.0), (1.0, None, math.inf)],
    ids=["half-infinitely-fast", "half-twice-as-fast", "no-share", "no-speedup", "everything"],
)
def test_amdahl_bound(share, speedup, expected):
    assert amdahl(share, speedup) == pytest.approx(expected)


def test_fragmentation_counts_launches_per_step_and_median():
    prof = story_after_attention()
    glue = fragmentation(prof, ["elementwise", "reduction", "copy"])
    assert glue.launches == 40000 + 15000 + 5000
    assert glue.launches_per_step == pytest.approx(6000.0)
    # launch-weighted median of per-kernel means: 40000 elementwise launches at 0.1 µs dominate
    assert glue.median_kernel_us == pytest.approx(0.1)
    assert glue.share == pytest.approx(6000.0 / 10000.0)
    assert glue.tiny


def test_story_recommends_the_fp32_gemm_flip_over_speculative_glue():
    rec = recommend(story_after_attention())
    assert rec.chosen is not None and rec.chosen.name == "bf16-gemm"
    assert rec.chosen.share == pytest.approx(0.192)
    by_name = {c.name: c for c in rec.candidates}
    assert by_name["mma-attn"].enabled  # already on: listed, not chosen
    assert by_name["fuse-glue"].amdahl_bound == pytest.approx(amdahl_of(0.6, fuse_glue_on_record(32)))
    text = " ".join(rec.explanation)
    assert "fuse-glue" in text and "launches/step" in text


def test_no_applicable_optimisation_falls_back_to_a_lever():
    prof = make_profile([("nvjet_sm90_tst_64x8", "gemm_tc", 10, 900.0), ("elementwise_kernel", "elementwise", 10, 100.0)])
    rec = recommend(prof)
    assert rec.chosen is not None and rec.chosen.kind == "lever"
    assert rec.chosen.name == "fp8-weights"


def test_fp8_weights_counts_only_gemms_over_16_bit_weights():
    """Block-FP8 GEMMs and cuBLAS's FP8 GEMMs already read 8-bit weights; the indexer's q x K multiplies
    the key cache, not weights: none of them is time fp8 weights could halve. Kernel names from H200
    profiles (evidence/h200/profiles/grouped-moe-263f33b/, tests/analysis/test_classify_h200.py)."""
    fp8_cublas = "nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT"
    prof = make_profile([("_block_fp8_matmul_kernel", "gemm_tc", 10, 300.0), ("_indexer_logits_kernel", "gemm_tc", 10, 200.0),
                         (fp8_cublas, "gemm_tc", 10, 100.0), ("nvjet_sm90_tst_512x32_64x3_2x1_v_bz_TNT", "gemm_tc", 10, 100.0),
                         ("elementwise_kernel", "elementwise", 10, 300.0)])
    lever = next(c for c in recommend(prof).candidates if c.name == "fp8-weights")
    assert lever.share == pytest.approx(0.1) and "16-bit weights" in lever.share_of
    only_narrow = make_profile([("_block_fp8_matmul_kernel", "gemm_tc", 10, 400.0), (fp8_cublas, "gemm_tc", 10, 100.0),
                                ("elementwise_kernel", "elementwise", 10, 500.0)])
    assert not any(c.name == "fp8-weights" for c in recommend(only_narrow).candidates)


def test_empty_profile_recommends_nothing():
    prof = make_profile([])
    rec = recommend(prof)
    assert rec.chosen is None
    assert diagnose(prof).lines() == ["no kernels in this profile: nothing to diagnose"]


def test_diagnosis_names_top_kernel_category_and_glue():
    lines = diagnose(story_after_attention()).lines()
    assert lines[0].startswith("#1 kernel: ") and "60.0%" not in lines[0]
    assert "elementwise 40.0%" in lines[0]
    assert "6000 launches/step" in lines[1] and "fragmented" in lines[1]


def test_per_slot_moe_fallback_recommends_grouped_moe_and_only_there():
    """SGLang's sm_120 MXFP4 fallback at 90% of an embedded DeepSeek-V4 profile: grouped-moe is the
    applicable optimisation; a MoE already grouped by expert gets no such candidate."""
    from dsv4opt.decision.recommend import measured_kernel_speedup
    from dsv4opt.optimizations.registry import get

    meta = {"target": "embedded", "config": "dsv4-flash", "concurrency": 32}
    prof = make_profile([("_mxfp4_slot_gemv_kernel", "moe", 20, 900.0), ("elementwise_kernel", "elementwise", 10, 100.0)],
                        meta=meta)
    rec = recommend(prof)
    assert rec.chosen is not None and rec.chosen.name == "grouped-moe" and rec.chosen.kind == "optimisation"
    speedup, _ = measured_kernel_speedup(get("grouped-moe"), 32)
    assert rec.chosen.amdahl_bound == pytest.approx(amdahl(0.9, speedup))
    grouped = make_profile([("cutlass_grouped_gemm_mxfp4", "moe", 20, 900.0), ("elementwise_kernel", "elementwise", 10, 100.0)],
                           meta=meta)
    assert "grouped-moe" not in {c.name for c in recommend(grouped).candidates}


def _attention_heavy(meta):
    return make_profile([("flash_fwd_splitkv_kernel", "attention", 10, 600.0), ("elementwise_kernel", "elementwise", 10, 400.0)],
                        meta=meta)


def test_optimisations_are_recommended_only_for_the_model_they_fit():
    """A Qwen3-8B trace from an MI300X never gets the DeepSeek sparse-MLA kernel; a trace that does
    not name its model gets it listed, not chosen, with the reason."""
    qwen = recommend(_attention_heavy({"model": "Qwen/Qwen3-8B"}))
    assert "mma-attn" not in {c.name for c in qwen.candidates}
    unknown = recommend(_attention_heavy({}))
    mma = {c.name: c for c in unknown.candidates}["mma-attn"]
    assert mma.fits is None and unknown.chosen is not mma
    assert any("mma-attn would target" in line and "does not say which model" in line for line in unknown.explanation)
    dsv4 = recommend(_attention_heavy({"model": "deepseek-ai/DeepSeek-V4-Flash"}))
    assert dsv4.chosen is not None and dsv4.chosen.name == "mma-attn"


def test_a_lever_is_called_advice():
    prof = make_profile([("elementwise_kernel", "elementwise", 1000, 900.0), ("nvjet_sm90", "gemm_tc", 10, 100.0)])
    text = " ".join(recommend(prof).explanation)
    assert "advice: dsv4opt has no switch for it" in text


def test_torch_compile_is_an_optimisation_on_the_glue_but_unmeasured_it_does_not_outrank_a_firm_bound():
    rec = recommend(story_after_attention())
    names = [c.name for c in rec.candidates]
    assert names.count("torch-compile") == 1  # the optimisation, no lever of the same name
    compiled = rec.candidates[names.index("torch-compile")]
    assert compiled.kind == "optimisation" and compiled.target == "glue" and compiled.share == pytest.approx(0.6)
    assert compiled.amdahl_bound == pytest.approx(1 / (1 - 0.6)) and compiled.amdahl_bound > rec.chosen.amdahl_bound
    assert rec.chosen.name == "bf16-gemm"
    text = " ".join(rec.explanation)
    assert "torch-compile bounds higher" in text and "`dsv4opt apply torch-compile` measures it" in text


def test_torch_compile_is_chosen_when_nothing_firm_promises_enough():
    """90% glue over 2,000 tiny launches a step and no other target: the unmeasured lever is the way on."""
    prof = make_profile([("elementwise_kernel", "elementwise", 20000, 900.0), ("nvjet_sm90", "gemm_tc", 10, 100.0)],
                        meta={"target": "embedded", "config": "dsv4-flash", "concurrency": 32})
    rec = recommend(prof)
    assert rec.chosen is not None and rec.chosen.name == "torch-compile" and rec.chosen.kind == "optimisation"
    assert rec.chosen.amdahl_bound == pytest.approx(10.0)


def _vllm_like():
    """A vLLM decode trace's shape: a fused MoE kernel grouped by expert at 69.1%, dense GEMMs 12.8%,
    the rest glue and attention (figures as `analyze` gave them on the trace the review used)."""
    return make_profile([("fused_moe_kernel", "moe", 480, 691.0), ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNN", "gemm_tc", 900, 128.0),
                         ("paged_attention_v2_kernel", "attention", 240, 90.0), ("elementwise_kernel", "elementwise", 3000, 91.0)])


def test_the_largest_category_is_named_when_no_optimisation_targets_it():
    """MoE at 69.1% once went unmentioned while the text called GEMM at 12.8% "the largest remaining target"."""
    rec = recommend(_vllm_like())
    text = " ".join(rec.explanation)
    assert text.startswith("the largest category is MoE at 69.1% of GPU time: no lever here (grouped-moe replaces "
                           "slot_gemv kernels, and none of the top five here is one)")
    assert "largest remaining target" not in text
    assert "the largest target with a lever is tensor-core GEMM at 12.8%" in text


def test_the_largest_category_with_its_optimisation_already_on_says_so():
    meta = {"target": "embedded", "config": "dsv4-flash", "concurrency": 32, "optimizations": ["grouped-moe"]}
    prof = make_profile([("_moe_gate_up_kernel", "moe", 20, 600.0), ("nvjet_sm90_tst", "gemm_tc", 10, 400.0)], meta=meta)
    text = " ".join(recommend(prof).explanation)
    assert "the largest category is MoE at 60.0% of GPU time: grouped-moe already on, no further lever here" in text


def test_the_largest_category_with_a_candidate_is_left_to_the_table():
    text = " ".join(recommend(story_after_attention()).explanation)
    assert "the largest category" not in text  # elementwise leads, and fuse-glue targets it


def test_the_vllm_decode_trace_names_moe():
    """On the third-party vLLM decode trace the review used, when it is in ../shared/traces."""
    from dsv4opt.analysis import analyze_paths
    from tests.helpers import shared_traces

    found = [p for p in shared_traces() if "vllm" in p.name.lower()]
    if not found:
        pytest.skip("no vLLM trace in ../shared/traces")
    prof = analyze_paths([found[0]])
    top = prof.top_category
    text = " ".join(recommend(prof).explanation)
    assert f"{top.label} at {top.share:.1%}" in text
