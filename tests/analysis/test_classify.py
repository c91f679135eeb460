import re

import pytest

from dsv4opt.analysis.categories import CATEGORIES
from dsv4opt.analysis.classify import RULES, _first_rule, classify, matching_rule
from dsv4opt.analysis.names import demangle, short_name

# Names from ../shared/traces (NVIDIA A100/V100/H100, AMD MI300X) unless marked otherwise.
REAL = [
    ("volta_sgemm_64x64_nt", "gemm_fp32_simt"),
    ("ampere_sgemm_128x128_tn", "gemm_fp32_simt"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32_8x5_nn_align1::Params)", "gemm_fp32_simt"),
    # Written from the H200 notes' prefixes (sm80_xmma_..._ffma_, nvjet_sm90_tst_, ncclDevKernel_, gatherTopK).
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas", "gemm_fp32_simt"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4::Params)", "gemm_tc"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "gemm_tc"),
    ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "gemm_tc"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1", "gemm_tc"),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>, false>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0, 1, 128, 256, false, 4, 1, ck_tile::ComposedAttention<0u, false> >(__hip_bfloat16 const*)", "attention"),
    ("attn_fwd", "attention"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "communication"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)", "elementwise"),
    ("triton_poi_fused__unsafe_view_mul_silu_2", "elementwise"),
    # The glue torch-compile fuses next to the per-slot MoE GEMVs, named as Inductor named it on this
    # project's CPU (cpp_fused_...; triton_poi_ on a GPU): glue, not MoE.
    ("triton_poi_fused__unsafe_view_arange_clamp_clone_expand_index_mul_mxfp4_slot_gemv_repeat_silu_slice_unsqueeze_view_0",
     "elementwise"),
    ("_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i", "elementwise"),
    ("void rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*)", "elementwise"),
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "reduction"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)", "reduction"),
    ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb1ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib", "reduction"),
    ("Memcpy HtoD (Pinned -> Device)", "copy"),
    ("Memset (Device)", "copy"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>(float*)", "copy"),
    ("void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)", "copy"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>)", "copy"),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, int>::Policy800, false, long, int, int, int>(int*)", "topk_sort"),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float const, unsigned int>)", "topk_sort"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long, long, float const*, float const*, float const*, float const*, float*, float*)", "reduction"),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)0>(cudnn::ops::nchw2nhwc_params_t<float>)", "copy"),
    # Patterns the shared model notes list for an H200 (torch 2.11 / CUDA 13); the notes give name
    # prefixes, so these full names are written in those kernels' naming schemes, not copied from a trace.
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, cutlass::gemm::collective::CollectiveMma<> > >(cutlass::gemm::kernel::GemmUniversal<>::Params)", "gemm_tc"),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, cutlass::gemm::collective::CollectiveMma<> > >(cutlass::gemm::kernel::GemmUniversal<>::Params)", "moe"),
    ("triton_tem_fused_mm_0", "gemm_tc"),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<flashinfer::PosEncodingMode)0, 2u, 4u, 8u, 16u, 1u, 8u>(flashinfer::Params)", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "attention"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl<at::native::OpaqueType<2> > >(at::TensorIteratorBase&)::{lambda(int)#1}>(long, at::native::gpu_index_kernel<>::{lambda(int)#1})", "copy"),
    ("void at::native::radixSortKVInPlace<-2, -1, 32, 4, float, long, unsigned int>(at::cuda::detail::TensorInfo<float, unsigned int>)", "topk_sort"),
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "reduction"),
    ("void cross_device_reduce_1stage<__nv_bfloat16, 8>(sglang::RankData*, sglang::RankSignals, sglang::Signal*, __nv_bfloat16*, int, int)", "communication"),
    ("void (anonymous namespace)::resolve_future_token_ids_kernel<long>(long*, long const*, unsigned long)", "other"),
]


@pytest.mark.parametrize("name,category", REAL, ids=[f"{c}-{i}" for i, (_, c) in enumerate(REAL)])
def test_real_names(name, category):
    assert classify(name) == category


@pytest.mark.parametrize("rule", RULES, ids=[f"{i}-{r.category}" for i, r in enumerate(RULES)])
def test_each_rule_example_lands_in_its_row(rule):
    assert rule.category in CATEGORIES
    assert matching_rule(rule.example) is rule


def test_demangle_and_shorten():
    assert demangle("_ZN7cutlass13device_kernelIiEEvv") == "void cutlass::device_kernel<int>()"
    # Newer manglings older libstdc++ rejects still give the qualified name (a newer libstdc++, as
    # on the H200 image, demangles them whole: "void aiter::add_rmsnorm_quant_kernel<std::bfloat16_t, ...").
    name = demangle("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256EEEvPT0_")
    assert name.removeprefix("void ").startswith("aiter::add_rmsnorm_quant_kernel<"), name
    assert short_name("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, X> >(at::native::ReduceOp<float, X>)") == "reduce_kernel<512, 1, ReduceOp<…> >"
    assert short_name("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"


# Inductor names a kernel after its kind and the aten ops it was generated from
# ("triton_" + {poi, red, per, for, tem} + "_fused_" + ops + "_" + index, torch/_inductor/codegen).
# These are written in that scheme with the op mixes the compiled DeepSeek-style decode trace of
# the analysis issue showed (SDPA glue, bmm, grouped_mm, moe_forward), not copied from a trace.
INDUCTOR_FUSED = [
    ("triton_poi_fused__scaled_dot_product_efficient_attention_add_transpose_view_3", "elementwise"),
    ("triton_poi_fused_bmm_clone_permute_view_12", "elementwise"),
    ("triton_poi_fused__grouped_mm_index_view_7", "elementwise"),
    ("triton_red_fused__to_copy_moe_forward_sum_view_21", "reduction"),
    ("triton_per_fused__softmax_scaled_dot_product_attention_5", "reduction"),
    ("triton_poi_fused_all_reduce_copy_0", "elementwise"),
    ("triton_for_fused_0", "elementwise"),
    ("triton_tem_fused_addmm_relu_4", "gemm_tc"),
]


@pytest.mark.parametrize("name,category", INDUCTOR_FUSED, ids=[n for n, _ in INDUCTOR_FUSED])
def test_inductor_fused_names_are_not_read_as_the_ops_they_mention(name, category):
    assert classify(name) == category


# Kernel names of serving libraries, each from the project's source as noted (demangled as the
# profiler prints them; parameter lists shortened to "(...)").
SERVING = [
    # triton_kernels (vLLM / SGLang MXFP4 MoE): make_matmul_repr names, routing and bitmatrix kernels
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1", "moe"),
    ("_p_matmul_ogs_NNT_bf16xbf16xmxfp4_128x256x128x1", "moe"),
    ("_combined_routing_compute", "moe"),
    ("_combined_routing_memset", "moe"),
    ("_sum_bitmatrix_rows", "moe"),
    # vLLM csrc: fused MoE (moe_align_sum_kernels.cu, topk_softmax_kernels.cu), cache, quant, Marlin
    ("void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned long, int*)", "moe"),
    ("void vllm::moe::topkGatingSoftmax<4, 4, 4, 16, 32, int>(float const*, bool const*, float*, int, int*, int*, int, int, int)", "moe"),
    ("fused_moe_kernel", "moe"),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(...)", "copy"),
    ("void vllm::concat_and_cache_mla_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>(...)", "copy"),
    ("void vllm::scaled_fp8_quant_kernel<c10::BFloat16, c10::Float8_e4m3fn>(c10::Float8_e4m3fn*, c10::BFloat16 const*, float const*, long)", "elementwise"),
    ("void vllm::dynamic_per_token_scaled_fp8_quant_kernel<c10::BFloat16, c10::Float8_e4m3fn>(...)", "elementwise"),
    ("void vllm::segmented_max_reduction<c10::BFloat16, c10::Float8_e4m3fn>(float*, c10::BFloat16 const*, long)", "reduction"),
    ("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16*, c10::BFloat16 const*, float, int, int)", "reduction"),
    ("void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::silu_kernel<c10::BFloat16>(c10::BFloat16 const&)), true>(...)", "elementwise"),
    ("void marlin::Marlin<(vllm::ScalarType)0, 256, 1, 8, 8, 8, 4, false, -1, true>(...)", "gemm_tc"),
    ("void marlin_moe_wna16::Marlin<(vllm::ScalarType)0, 256, 1, 8, 8, 8, 4, false, -1, true>(...)", "moe"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)", "communication"),
    ("_w8a8_block_fp8_matmul", "gemm_tc"),
    # SGLang: triton decode attention, KV index building (tracelens MI300X trace), quant, MoE gate
    ("_fwd_grouped_kernel_stage1", "attention"),
    ("_fwd_kernel_stage2", "attention"),
    ("create_flashinfer_kv_indices_triton", "copy"),
    ("write_req_to_token_pool_triton", "copy"),
    ("void per_token_group_quant_8bit_kernel<__nv_bfloat16, c10::Float8_e4m3fn, false>(...)", "elementwise"),
    ("_per_token_group_quant_fp8", "elementwise"),
    ("void moe_fused_gate_kernel<float, 256, 8, 8, 4, 32>(...)", "moe"),
    # FlashInfer (include/flashinfer/...): attention, norm, sampling, rope
    ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<>, flashinfer::PagedParams>(...)", "attention"),
    ("void flashinfer::mla::BatchMLAPagedAttentionKernel<flashinfer::mla::KernelTraits<>, flashinfer::mla::Params>(...)", "attention"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, unsigned int, unsigned int, unsigned int, float, float)", "reduction"),
    ("void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<true, 128u, 8u, 16u, __nv_bfloat16, long>(...)", "elementwise"),
    ("void flashinfer::MergeStatesKernel<8u, 16u, 2u, 4u, __nv_bfloat16, __nv_bfloat16>(...)", "attention"),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::BlockScanAlgorithm)0, (cub::BlockReduceAlgorithm)2, 4u, true, float, int>(...)", "topk_sort"),
    # TensorRT-LLM: NVFP4 quant, MoE finalize, trtllm-gen attention
    ("void tensorrt_llm::kernels::cvt_fp16_to_fp4<__nv_bfloat16, false>(...)", "elementwise"),
    ("void tensorrt_llm::kernels::finalizeMoeRoutingKernel<__nv_bfloat16, __nv_bfloat16, false>(...)", "moe"),
    ("fmhaSm100fKernel_QkvE4m3OBfloat16HQk576HV512HVPerCta256PagedKvSparseMlaP64VarSeqQ16Kv128PersistentSwapsAbForGen", "attention"),
    # DeepGEMM: a dense FP8 GEMM (GemmType 0) stays a GEMM; DeepEP dispatch is communication
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u, 1u, 128u, 128u, 128u, 32u, 4u, 128u, 128u, 1u, 1u, (deep_gemm::GemmType)0>(...)", "gemm_tc"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u, 4u, 128u, 128u, 128u, 32u, 4u, 128u, 128u, 1u, 1u, (deep_gemm::GemmType)2>(...)", "moe"),
    ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(...)", "communication"),
]


@pytest.mark.parametrize("name,category", SERVING, ids=[f"{c}-{i}" for i, (_, c) in enumerate(SERVING)])
def test_serving_library_names(name, category):
    assert classify(name) == category



def _first_rule_ignoring_case(text: str):
    return next((i for i, rule in enumerate(RULES) if re.search(rule.pattern, text, re.IGNORECASE)), None)


@pytest.mark.parametrize("case", [str, str.upper, str.swapcase, lambda s: s + " µs"], ids=["as-is", "upper", "swapped", "non-ascii"])
def test_lower_case_matching_is_ignorecase(case):
    """classify matches ASCII names in lower case (faster); every name must land where IGNORECASE puts it."""
    names = [n for n, _ in REAL] + [r.example for r in RULES] + ["ſoftmax_kernel", "KERNEL_K", "misc_kernel"]
    for name in names:
        text = case(name)
        assert _first_rule(text) == _first_rule_ignoring_case(text), text
