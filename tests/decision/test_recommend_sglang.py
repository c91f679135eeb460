"""recommend on profiles of an SGLang server reads the version table: what that version already does
upstream is not recommended (and it says so), a speed-up on record timed against a kernel that
version does not run is not used, and a version dsv4opt does not know is named as such."""

from __future__ import annotations

import pytest

from dsv4opt.decision.recommend import amdahl, measured_kernel_speedup, recommend
from dsv4opt.optimizations.registry import get
from tests.decision.profiles import make_profile

DSV4 = "deepseek-ai/DeepSeek-V4-Flash"
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def sm120_profile(meta: dict):
    # what a 0.5.23 sm_120 decode shows (names as tests/analysis/test_classify_sglang_0523.py has them)
    return make_profile([
        ("mhc_fused_post_pre_fma_tilelang_kernel", "gemm_fp32_simt", 430, 400.0),
        ("void flashinfer::sparse_mla_sm120::sparse_mla_decode_dsv4_kernel<...>(...)", "attention", 430, 300.0),
        ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<...> > >(...)",
         "moe", 430, 300.0),
    ], meta={"concurrency": 32, "model": DSV4, **meta})


def test_on_0_5_23_bf16_gemm_is_upstream_and_mma_attn_has_no_record_there():
    rec = recommend(sm120_profile({"target": "sglang", "sglang_version": "0.5.23", "device": RTX}))
    cands = {c.name: c for c in rec.candidates}
    bf16 = cands["bf16-gemm"]
    assert bf16.fits is False and bf16.notes[0].startswith("already upstream in SGLang 0.5.23 (sm_120: the indexer runs")
    # listed apart, with why, and not ranked nor argued against in the prose
    assert bf16 in rec.not_applicable and bf16 not in rec.ranked and bf16.why_not == bf16.notes[0]
    assert not any("bf16-gemm" in line for line in rec.explanation)
    assert "Hopper" not in bf16.notes[0]  # the device says sm_120: only its family is quoted
    mma = cands["mma-attn"]
    # the figure on record was timed against SGLang 0.5.14's sm_120 kernel; 0.5.23 on sm_120 runs FlashInfer's
    assert mma.kernel_speedup is None
    assert mma.speedup_source.startswith("not measured on this path (SGLang 0.5.23 sm_120)")
    assert mma.amdahl_bound == pytest.approx(1 / (1 - 0.3))
    assert rec.chosen is mma


def test_the_same_kernels_without_a_version_choose_bf16_gemm():
    # the decision above is the version's doing: as a bare trace, bf16-gemm leads
    rec = recommend(sm120_profile({}))
    assert rec.chosen is not None and rec.chosen.name == "bf16-gemm"


def test_on_0_5_14_sm120_the_records_apply():
    rec = recommend(sm120_profile({"target": "sglang", "sglang_version": "0.5.14", "device": RTX}))
    cands = {c.name: c for c in rec.candidates}
    for name, share in (("bf16-gemm", 0.4), ("mma-attn", 0.3)):
        speedup, _ = measured_kernel_speedup(get(name), 32)
        assert cands[name].fits is True and cands[name].kernel_speedup == speedup
        assert cands[name].amdahl_bound == pytest.approx(amdahl(share, speedup))
    assert not any("upstream" in line for line in rec.explanation)


def test_the_family_comes_from_kernel_names_when_the_device_is_not_recorded():
    # 0.5.14 on Hopper: its float32 indexer and pre-mix fallbacks are sm_120's, so bf16-gemm is upstream
    prof = make_profile([
        ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel",
         "gemm_fp32_simt", 100, 500.0),
        ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNN", "gemm_tc", 100, 500.0),
    ], meta={"target": "sglang", "sglang_version": "0.5.14", "model": DSV4, "concurrency": 32})
    rec = recommend(prof)
    bf16 = {c.name: c for c in rec.candidates}["bf16-gemm"]
    assert bf16.fits is False and bf16.notes[0].startswith("already upstream in SGLang 0.5.14 (Hopper (sm_90): ")


def test_a_version_dsv4opt_does_not_know_is_named():
    rec = recommend(sm120_profile({"target": "sglang", "sglang_version": "0.5.20", "device": RTX}))
    assert rec.explanation[0] == ("SGLang 0.5.20 is not a version dsv4opt knows (0.5.14, 0.5.23): what it already "
                                  "does upstream is not checked")
    rec = recommend(sm120_profile({"target": "sglang"}))
    assert rec.explanation[0].startswith("SGLang (version not recorded) is not a version dsv4opt knows")
