"""Kernel names of SGLang 0.5.23's DeepSeek-V4 decode, and of the wheels it pins, land in the right
category. Each name is written from the source that defines the kernel (file:line given), as a trace
shows it demangled; template arguments and parameter lists are illustrative where the source makes
them at compile time. No trace of a live 0.5.23 server was available (docs/sglang.md)."""

from __future__ import annotations

import pytest

from dsv4opt.analysis.categories import ATTENTION, COPY, ELEMENTWISE, GEMM_FP32_SIMT, GEMM_TC, MOE, REDUCTION
from dsv4opt.analysis.classify import classify

FI = "flashinfer-python 0.7.2, flashinfer/data/include/flashinfer/attention/sparse_mla_sm120"
TRTLLM = "flashinfer-python 0.7.2, flashinfer/data/csrc/fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh"
FLASHMLA = "deepseek-ai/FlashMLA@9241ae3 (namespace legacy:: as in the sgl-flash-mla 1.0.0 wheel's symbols)"
SG = "sglang 0.5.23 wheel, sglang"
TL = "TileLang names a kernel `{function}_kernel` (tile-ai/tilelang#2949)"
DG = "deepseek-ai/DeepGEMM@54e2261, deep_gemm/include/deep_gemm/impls"

NAMES = [
    # FlashInfer's sm_120 sparse-MLA decode, SGLang 0.5.23's default on sm_120
    ("void flashinfer::sparse_mla_sm120::sparse_mla_decode_dsv4_kernel<(flashinfer::sparse_mla_sm120::ModelType)0, 64, "
     "flashinfer::sparse_mla_sm120::Fp8DecodeGatherSchedule>(__nv_bfloat16 const*, unsigned char const*, int const*, "
     "__nv_bfloat16*, float*, int const*)", ATTENTION, f"{FI}/kernels/fp8_decode/decode.cuh:49-53"),
    ("void flashinfer::sparse_mla_sm120::sparse_mla_decode_dsv4_merge_kernel<64, 512, 64, 8>(__nv_bfloat16 const*, "
     "float const*, __nv_bfloat16*, float*, float const*, int, int, int, int, unsigned long, float)", ATTENTION,
     f"{FI}/execution/merge.cuh:10-12"),
    ("_page_split_kernel", COPY, f"{SG}/kernels/ops/attention/flash_mla_sm120.py:395"),
    ("_page_mark_kernel", COPY, f"{SG}/kernels/ops/attention/flash_mla_sm120.py:455"),
    # FlashMLA's sparse FP8 decode, SGLang 0.5.23's default on Hopper
    ("void legacy::sm90::decode::sparse::flash_fwd_splitkv_mla_fp8_sparse_kernel<legacy::sm90::decode::sparse::"
     "KernelTemplate<(ModelType)1, 64>, TmaParams<cute::tuple<int, int, int, int> > >(SparseAttnDecodeParams, "
     "TmaParams<cute::tuple<int, int, int, int> >)", ATTENTION, f"{FLASHMLA} csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:682"),
    ("void legacy::smxx::decode::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512, 64, 32, 128>(CombineParams)",
     ATTENTION, f"{FLASHMLA} csrc/smxx/decode/combine/combine.cu:20"),
    ("legacy::smxx::decode::get_mla_metadata_kernel(GetDecodeSchedMetaParams)", ATTENTION,
     f"{FLASHMLA} csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu:12"),
    # FlashInfer's CUTLASS MoE (flashinfer_mxfp4: MXFP8 x MXFP4 on sm_120, W4A16 on Hopper)
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<long, "
     "long, long> >, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm120TmaWarpSpecializedBlockScaled<3, "
     "2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cutlass::gemm::KernelTmaWarpSpecializedCooperative> > > >(...)",
     MOE, "flashinfer-python 0.7.2, flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/include/"
          "moe_gemm_kernels.h:139 (its ProblemShape, GroupProblemShape)"),
    ("void tensorrt_llm::kernels::cutlass_kernels::doGatedActivationKernel<__nv_bfloat16, __nv_bfloat16, "
     "tensorrt_llm::kernels::cutlass_kernels::GLUAdaptor<cutlass::epilogue::thread::SiLu> >(__nv_bfloat16*, "
     "__nv_bfloat16 const*, long const*, long, long, tensorrt_llm::kernels::cutlass_kernels::ActivationParams)",
     MOE, f"{TRTLLM}:2329"),
    ("void tensorrt_llm::kernels::cutlass_kernels::finalizeMoeRoutingKernel<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, "
     "(tensorrt_llm::kernels::cutlass_kernels::ScaleMode)1>(__nv_bfloat16 const*, __nv_bfloat16*, __nv_bfloat16 const*, "
     "float const*, int const*, int const*, long, long, long, int, int)", MOE, f"{TRTLLM}:1965"),
    ("void tensorrt_llm::kernels::cutlass_kernels::expandInputRowsKernel<__nv_bfloat16, __nv_fp8_e4m3, "
     "(tensorrt_llm::kernels::cutlass_kernels::TmaWarpSpecializedGroupedGemmInput::FpXBlockScalingType)2, false, false, "
     "std::integral_constant<bool, false> >(__nv_bfloat16 const*, __nv_fp8_e4m3*, float const*, float*, int const*, "
     "int const*, long, long, long, float const*, bool, long const*)", MOE, f"{TRTLLM}:1572"),
    # Marlin's W4A16 MoE (opt-in in 0.5.23; 0.5.14's sm_120 default)
    ("void sglang::device::marlin_moe::Marlin<cutlass::bfloat16_t, 4, 8, 8, true, 4, 8, 256, false, false, 4, 0, false, "
     "false>(int4 const*, int4 const*, int4*, int4*, void const*, int4 const*, int const*, int const*, int const*, "
     "float const*, int, bool, int, int, int, int, int, int*, bool, bool, bool, int)", MOE,
     f"{SG}/kernels/jit/csrc/gemm/marlin_moe/marlin_template.h:330"),
    # TileLang: the indexer and the mHC boundary
    ("fp8_paged_mqa_logits_kernel", GEMM_TC, f"{SG}/kernels/ops/attention/dsa/tilelang_kernel.py:1289; {TL}"),
    ("mhc_fused_post_pre_fma_tilelang_kernel", GEMM_FP32_SIMT, f"{SG}/kernels/ops/layernorm/mhc.py:1368; {TL}"),
    ("mhc_pre_big_fuse_with_norm_tilelang_kernel", REDUCTION, f"{SG}/kernels/ops/layernorm/mhc.py:897; {TL}"),
    ("mhc_pre_big_fuse_tilelang_kernel", REDUCTION, f"{SG}/kernels/ops/layernorm/mhc.py:472; {TL}"),
    ("hc_split_sinkhorn_kernel__kernel", REDUCTION, f"{SG}/kernels/ops/layernorm/mhc.py:250; {TL}"),
    ("mhc_post_tilelang_kernel", ELEMENTWISE, f"{SG}/kernels/ops/layernorm/mhc.py:1272; {TL}"),
    ("mhc_pre_gemm_sqrsum_splitk_stage_0_kernel", GEMM_TC, f"{SG}/kernels/ops/layernorm/mhc.py:710 (a T.gemm); {TL}"),
    ("mhc_pre_gemm_sqrsum_splitk_stage_1_kernel", REDUCTION, f"{SG}/kernels/ops/layernorm/mhc.py:777; {TL}"),
    # DeepGEMM (Hopper's indexer and mHC pre-norm)
    ("void deep_gemm::sm90_fp8_paged_mqa_logits<64u, 1u, 128u, 2u, 1u, 1u, 128u, 256u>(unsigned int, unsigned long, "
     "unsigned int, unsigned int, unsigned int, unsigned int*, float*, float const*, unsigned int const*, "
     "unsigned int const*, CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap)", GEMM_TC,
     f"{DG}/sm90_fp8_paged_mqa_logits.cuh:30"),
    ("void deep_gemm::sm90_tf32_hc_prenorm_gemm_impl<24u, 16384u, 64u, 32u, 64u, 4u, 128u, 128u, 1u>(unsigned int, "
     "CUtensorMap, CUtensorMap, CUtensorMap, float*)", GEMM_TC, f"{DG}/sm90_tf32_hc_prenorm_gemm.cuh:42"),
    ("void deep_gemm::smxx_clean_logits<4u, 8u>(unsigned int, unsigned int, unsigned long, unsigned int const*, "
     "unsigned int const*, float*)", COPY, f"{DG}/smxx_clean_logits.cuh:13"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u, 4u, 128u, 128u, 128u, 32u, 4u, 128u, 128u, 1u, 1u, "
     "(deep_gemm::GemmType)0>(float*, int*, unsigned int, unsigned int, unsigned int, CUtensorMap, CUtensorMap, "
     "CUtensorMap, CUtensorMap)", GEMM_TC, f"{DG}/sm90_fp8_gemm_1d2d.cuh:50"),
]


@pytest.mark.parametrize("name, category, source", NAMES, ids=[n[2].rsplit("/", 1)[-1][:60] for n in NAMES])
def test_sglang_0_5_23_kernel_lands_in_its_category(name, category, source):
    assert classify(name) == category, (name, source)
