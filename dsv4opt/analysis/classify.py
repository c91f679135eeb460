"""Kernel name -> category, as an ordered pattern table: first match wins.

Each row carries a real kernel name it was written for (from real traces: NVIDIA A100/V100/H100/H200,
AMD MI300X; where a name comes from another project's source instead, the row says which file); tests/analysis/test_classify.py checks every example lands in its row.
Patterns match the demangled name, case-insensitively.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
import pandas as pd

from dsv4opt.analysis.categories import (
    ATTENTION, COMMUNICATION, COPY, ELEMENTWISE, GEMM_FP32_SIMT, GEMM_TC, MOE, OTHER, REDUCTION, TOPK_SORT,
)
from dsv4opt.analysis.codes import factorize_names
from dsv4opt.analysis.names import demangle


@dataclass(frozen=True)
class Rule:
    category: str
    pattern: str
    example: str
    why: str = ""


# Order matters: more specific rules first (an Inductor kernel is what its prefix says before it is
# any op its fused name mentions; a KV-cache store in an attention library is a copy; a grouped GEMM
# is MoE before it is a GEMM; an ffma xmma GEMM is SIMT before it is an xmma GEMM; a copy written as
# an elementwise functor is a copy). Each row's example is a real kernel name; where it comes from
# another project's source rather than a trace, the row says so.
RULES: tuple[Rule, ...] = (
    # Inductor names its kernels "triton_" + {poi, red, per, for, tem} + "_fused_" + the aten ops
    # the kernel was generated from (torch/_inductor/codegen): a pointwise kernel that fused the
    # glue around an SDPA or a bmm is named after them and is still pointwise, and one fused with a
    # custom kernel (triton_poi_fused_..._mxfp4_slot_gemv_...) is not that kernel.
    Rule(REDUCTION, r"^triton_(?:red|per)_",
         "triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1",
         "Inductor reductions (red: looped, per: persistent) by their prefix, whatever they fuse (tracelens_torch_compile_triton)"),
    Rule(ELEMENTWISE, r"^triton_(?:poi|for)_",
         "triton_poi_fused__unsafe_view_mul_silu_2",
         "Inductor pointwise (poi) and foreach (for) kernels by their prefix (tracelens_torch_compile_triton)"),
    Rule(GEMM_TC, r"^triton_tem_",
         "triton_tem_fused_mm_0",
         "Inductor's Triton GEMM templates (max-autotune mm/addmm/bmm, epilogues fused), named as Inductor names them"),
    Rule(COMMUNICATION, r"nccl|rccl|all_?reduce|allgather|all_gather|reduce_?scatter|all_?to_?all|cross_device_reduce|one_shot|two_shot|mscclpp|deep_ep|dispatch_combine",
         "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"),
    Rule(COPY, r"reshape_and_cache|concat_and_cache|store_kvcache|kv_indices|write_req_to_token",
         "create_flashinfer_kv_indices_triton",
         "KV-cache stores and page-index building next to attention (SGLang's create_flashinfer_kv_indices_triton "
         "and store_kvcache from tracelens_sglang_qwen3_8b_decode_mi300x; vLLM's reshape_and_cache_flash_kernel and "
         "concat_and_cache_mla_kernel, csrc/cache_kernels.cu): their names say flash/mla/kv but they move data"),
    Rule(MOE, r"grouped_?gemm|groupproblemshape|moe|expert|topk_softmax|topkgating|moe_align|count_and_sort_expert|group_gemm|m_grouped|grouped_mm",
         "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, ...> >(...)",
         "grouped GEMMs and expert routing"),
    Rule(MOE, r"mxfp4.*slot|slot_gemv",
         "_mxfp4_slot_gemv_kernel",
         "SGLang's sm_120 MXFP4 expert fallback: one CUDA-core GEMV per (token, expert) slot (seen on an H200 in this project's embedded baseline)"),
    Rule(MOE, r"matmul_ogs|_combined_routing|_routing_(?:compute|clear|memset)|bitmatrix",
         "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x256x128x1",
         "triton_kernels' MoE (vLLM's and SGLang's MXFP4 path): expert GEMMs named by make_matmul_repr "
         "(matmul_ogs_details/_common.py: layouts_dtypes_blocks), routing (_combined_routing_compute, "
         "_sum_bitmatrix_rows); without this row matmul_ogs reads as a dense GEMM"),
    Rule(MOE, r"deep_gemm::.*gemmtype\)\s*[12]\b",
         "void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u, 4u, 128u, 128u, 128u, 32u, 4u, 128u, 128u, 1u, 1u, (deep_gemm::GemmType)1>(float*, int*, unsigned int, unsigned int, unsigned int, CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap)",
         "DeepGEMM's grouped GEMMs (GemmType 1 MGroupedContiguous, 2 MGroupedMasked) are the experts; written "
         "in DeepGEMM's naming (deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh: the GEMM type is a "
         "template argument); the other template values are illustrative, not copied from a trace"),
    # SGLang 0.5.23's decode (its PyPI wheel and the wheels it pins), rows where the rules below
    # would misread a name. TileLang names a kernel after its function, `{name}_kernel`
    # (tile-ai/tilelang#2949: two `def main` both emit `main_kernel`); those examples follow that rule.
    Rule(MOE, r"cutlass_kernels::(?:expandinputrows|doactivation|dogatedactivation|computestridestmawarpspecialized"
              r"|finalizemoerouting\w*|\w*expertprefixsum|fusedbuildexpertmapssortfirsttoken)kernel",
         "void tensorrt_llm::kernels::cutlass_kernels::doGatedActivationKernel<__nv_bfloat16, __nv_bfloat16, "
         "tensorrt_llm::kernels::cutlass_kernels::GLUAdaptor<cutlass::epilogue::thread::SiLu> >(__nv_bfloat16*, "
         "__nv_bfloat16 const*, long const*, long, long, tensorrt_llm::kernels::cutlass_kernels::ActivationParams)",
         "FlashInfer's cutlass_fused_moe runner around its grouped GEMMs (SGLang 0.5.23's flashinfer_mxfp4 MoE): "
         "row expansion, activation, strides, finalize (flashinfer-python 0.7.2, csrc/fused_moe/cutlass_backend/"
         "cutlass_fused_moe_kernels.cuh:1390, 1572, 1965, 2329, 2407; the example's template arguments are "
         "illustrative); where no grouped-GEMM type shows in a name, `cutlass` in it reads as a dense GEMM"),
    Rule(COPY, r"^_page_(?:split|mark)_kernel|deep_gemm::smxx_clean_logits",
         "_page_split_kernel",
         "SGLang 0.5.23's copy of the referenced window pages into FlashInfer's 64-token pages and the mask of "
         "those pages (kernels/ops/attention/flash_mla_sm120.py:395, 455); DeepGEMM's -inf fill of the logits "
         "outside each query's range (deep_gemm/include/deep_gemm/impls/smxx_clean_logits.cuh:13)"),
    Rule(GEMM_TC, r"^fp8_paged_mqa_logits_kernel",
         "fp8_paged_mqa_logits_kernel",
         "TileLang's FP8 indexer logits, a T.gemm (SGLang 0.5.23 kernels/ops/attention/dsa/tilelang_kernel.py:1289; "
         "DeepGEMM's deep_gemm::sm90_fp8_paged_mqa_logits is a GEMM by its namespace already)"),
    Rule(GEMM_FP32_SIMT, r"^mhc_fused_post_pre_fma_tilelang_kernel",
         "mhc_fused_post_pre_fma_tilelang_kernel",
         "SGLang 0.5.23's fused mHC boundary for 32 tokens or fewer: the post step and the fp32 pre-mix "
         "partials as CUDA-core FMAs (kernels/ops/layernorm/mhc.py:1368, fp32 operands at :1390-1394)"),
    Rule(REDUCTION, r"^(?:hc_split_sinkhorn_kernel_|mhc_pre_big_fuse\w*_tilelang|mhc_pre_gemm_sqrsum_splitk_stage_1)_kernel",
         "hc_split_sinkhorn_kernel__kernel",
         "TileLang's Sinkhorn normalisation, its fusion with the combine and RMSNorm, and the sum of the "
         "pre-mix GEMM's split-K partials (SGLang 0.5.23 kernels/ops/layernorm/mhc.py:250, 472, 777, 897)"),
    Rule(ELEMENTWISE, r"^mhc_post_tilelang_kernel",
         "mhc_post_tilelang_kernel",
         "TileLang's mHC post step, out = post * f(y) + comb @ residual (SGLang 0.5.23 kernels/ops/layernorm/mhc.py:1272)"),
    # This tool's embedded workload, where a name would read wrong: the indexer logits kernel (e4m3
    # or bf16 operands on tensor cores) is a GEMM, not an index copy; the Hopper path's fused mHC pre
    # step is what TileLang's big fuse above is.
    Rule(GEMM_TC, r"^_indexer_logits_kernel$",
         "_indexer_logits_kernel",
         "dsv4opt's indexer logits on tensor cores (dsv4opt/workload/kernels/indexer_tc.py): the Hopper path's "
         "stand-in for DeepGEMM's fp8_paged_mqa_logits, and bf16-gemm's kernel"),
    Rule(REDUCTION, r"^_hc_pre_big_fuse_kernel$",
         "_hc_pre_big_fuse_kernel",
         "dsv4opt's stand-in for TileLang's mhc_pre_big_fuse_with_norm (dsv4opt/workload/kernels/mhc_fused.py)"),
    Rule(ATTENTION, r"flash(?!infer)|fmha|sdpa|mla|attn|attention|batchdecode|batchprefill|paged_?attention|decode_?kernel|_fwd(?:_grouped)?_kernel_stage|merge_?state|single_?(?:decode|prefill)|cascade",
         "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, ...>, false, true, false, false, true, true, false>(pytorch_flash::Flash_fwd_params)",
         "attention kernels; FlashInfer's namespace alone says nothing (its norm, rope and sampling kernels live there too)"),
    Rule(GEMM_FP32_SIMT, r"sgemm|simt|_ffma|ffma_|gemm_f32f32_f32f32|scudnn|gemv.*<float|gemvx?_?kernel.*\bfloat\b|gemmsn_.*float|gemmk1_kernel<.*float|^cijk_(?!.*_mi\d)",
         "volta_sgemm_64x64_nt",
         "FP32 GEMM/GEMV on CUDA cores (also cuDNN's FP32 scudnn convolutions)"),
    Rule(GEMM_TC, r"(?<!fb)gemm|gemv|nvjet|tensorop|xmma|hmma|wgmma|cutlass|cublas|^cijk_|ck_tile.*gemm|matmul|triton_mm|_mm_|tl_dot|bmm|splitkreduce|marlin|cudnn.*conv|implicit_convolve|dgrad|wgrad",
         "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
         "tensor-core GEMM/GEMV, tf32 included (s1688gemm), Triton tl.dot matmuls, vLLM's Marlin mixed-precision GEMMs"),
    Rule(TOPK_SORT, r"topk|top_k|sort|radix|argsort|bitonic|segmented_sort|gathertopk",
         "void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, int>::Policy800, false, long, int, int, int>(...)"),
    Rule(COPY, r"^memcpy|^memset|copy|catarray|\bcat_|gather|scatter|index|(?<!rotary_)embedding|fill|permute|transpose|concat|\bstack|unfold|im2col|nchwtonhwc|nhwctonchw",
         "Memcpy HtoD (Pinned -> Device)",
         "memcpy, memset, copy/cat/gather/index/fill kernels (dtype conversion copies included)"),
    Rule(REDUCTION, r"reduce|reduction|norm|softmax|_per_fused|mean|argmax|argmin|\bsum\b|cumsum|scan|welford|bn_|batch_norm|gammabeta",
         "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >(...)"),
    Rule(ELEMENTWISE, r"quant|cvt_fp\d+_to_fp4",
         "void vllm::scaled_fp8_quant_kernel<c10::BFloat16, c10::Float8_e4m3fn>(c10::Float8_e4m3fn*, c10::BFloat16 const*, float const*, long)",
         "quantisation: a cast with a scale (vLLM's scaled_fp8_quant_kernel and dynamic_per_token_scaled_fp8_quant_kernel, "
         "csrc/quantization/fp8/common.cu; SGLang's per_token_group_quant_8bit; the NVFP4 cvt_fp16_to_fp4 of vLLM and "
         "TensorRT-LLM); after the reduction row, so a fused norm+quant stays a reduction"),
    Rule(ELEMENTWISE, r"elementwise|_poi_fused|functor|unrolled|vectorized|activation|act_and_mul|silu|gelu|relu|sigmoid|tanh|rotary|rope|pointwise|multi_tensor_apply|threshold|clamp|pool",
         "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"),
)

@cache
def _ignoring_case() -> tuple[re.Pattern, ...]:
    """RULES compiled with IGNORECASE, on first use: ASCII names seldom need them (_LOWER)."""
    return tuple(re.compile(r.pattern, re.IGNORECASE) for r in RULES)


def _lowercase_only(pattern: str) -> bool:
    """Whether the pattern spells every letter it matches in lower case: no upper-case letter
    outside an escape, no escape naming a character by number, no inline flags."""
    escapes = re.findall(r"\\.", pattern)
    bare = re.sub(r"\\.", "", pattern)
    return not re.search(r"[A-Z]|\(\?[aiLmsux-]", bare) and not any(e[1] in "xuUN0123456789" for e in escapes)


# For ASCII text, matching its lower-case copy case-sensitively is what IGNORECASE does, and about
# four times faster over long demangled names (a rule written otherwise keeps IGNORECASE).
_LOWER = tuple(re.compile(r.pattern) if _lowercase_only(r.pattern) else None for r in RULES)


def _first_rule(text: str) -> int | None:
    """Index in RULES of the first rule matching the text, None when none does."""
    lowered = text.lower() if text.isascii() else None
    for i, fast in enumerate(_LOWER):
        if fast.search(lowered) if fast is not None and lowered is not None else _ignoring_case()[i].search(text):
            return i
    return None


@lru_cache(maxsize=65536)
def classify(name: str) -> str:
    """Category of one kernel name (mangled or not); `other` when no rule matches."""
    i = _first_rule(_searchable(name))
    return OTHER if i is None else RULES[i].category


def classify_names(names: pd.Series) -> pd.Series:
    """Vectorised over distinct names: [N] names (strings or a categorical) -> [N] categories."""
    codes, distinct = factorize_names(names)
    return pd.Series(np.array([classify(n) for n in distinct], dtype=object)[codes], index=names.index,
                     name=names.name)


def _searchable(name: str) -> str:
    """The demangled name, plus the raw symbol when demangling fell back to the bare prefix (the
    template arguments, e.g. GroupProblemShape of a grouped GEMM, then live only in the raw text)."""
    text = demangle(name)
    return f"{text}\n{name}" if name.startswith("_Z") and "(" not in text else text


def matching_rule(name: str) -> Rule | None:
    i = _first_rule(_searchable(name))
    return None if i is None else RULES[i]


# CPU operators (aten names, matched whole: `aten::add` and its in-place `aten::add_`), used when a
# trace holds no GPU events. Same fixed categories, same first-match-wins order. Each example is an
# operator name from a CPU trace of the embedded workload (`dsv4opt profile --device cpu`) or from
# the CPU side of the shared traces (tracelens_h100_qwen1.5_0.5b for the attention row).
def _aten(*ops: str) -> str:
    return r"^aten::(?:" + "|".join(ops) + r")_?$"


CPU_RULES: tuple[Rule, ...] = (
    Rule(COMMUNICATION, r"^c10d::|^(?:gloo|nccl|ucc|mpi):",
         "c10d::_allgather_base_",
         "torch.distributed collectives: the c10d operator a rank calls (from `dsv4opt profile --ranks 2 --device cpu`); "
         "the backend's own ranges (gloo:all_gather) run on its threads"),
    Rule(ATTENTION, _aten(r"_?scaled_dot_product\w*", r"_?flash_attention\w*", r"_efficient_attention\w*", r"\w*_attention\w*"),
         "aten::scaled_dot_product_attention",
         "fused attention operators; the embedded workload's attention is spelled out in bmm/softmax instead"),
    Rule(GEMM_FP32_SIMT, _aten("mm", "bmm", "addmm", "addbmm", "baddbmm", "_addmm_activation", "matmul", "linear", "einsum",
                               "tensordot", "mv", "addmv", "dot", "vdot", "_scaled_mm", "_grouped_mm", r"_?mkldnn\w*", r"conv\w*"),
         "aten::mm",
         "matrix products on a CPU: general-purpose cores, no tensor cores, so FP32 GEMMs in the SIMT "
         "sense (the embedded CPU run is float32); einsum/matmul/linear dispatch to mm/bmm and keep only their own overhead"),
    Rule(TOPK_SORT, _aten("topk", "sort", "argsort", "msort", "kthvalue", "unique", r"_unique\d?"),
         "aten::topk"),
    Rule(COPY, _aten("copy", "_to_copy", "to", "clone", "contiguous", "_?cat", "stack", "index", "index_select", "index_put",
                     "_index_put_impl", "gather", r"scatter\w*", r"take\w*", "masked_select", "fill", "zero", "zeros",
                     "zeros_like", "ones", "ones_like", "full", "full_like", "scalar_tensor", r"empty\w*", r"new_\w*",
                     "arange", "linspace", r"repeat\w*", "embedding", "flip", "roll", "tril", "triu", "resize", "narrow_copy"),
         "aten::_to_copy",
         "data movement and allocation: copies and dtype conversions, cat/index/gather/scatter, fills and tensor creation"),
    Rule(REDUCTION, _aten("sum", "nansum", "mean", "amax", "amin", "max", "min", "aminmax", "argmax", "argmin", r"_?softmax",
                          r"_?log_softmax", "logsumexp", r"\w*norm", "var", "std", "var_mean", "std_mean", "cumsum",
                          "cumprod", "logcumsumexp", "prod", "all", "any", "count_nonzero"),
         "aten::sum"),
    Rule(ELEMENTWISE, _aten("add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "neg",
                            "abs", "sign", "clamp", "clamp_min", "clamp_max", "clip", "exp", "exp2", "expm1", "log", "log2",
                            "log10", "log1p", "pow", "square", "sqrt", "rsqrt", "reciprocal", "sigmoid", "silu", "gelu",
                            "relu", "tanh", "softplus", "sin", "cos", "where", "masked_fill", "maximum", "minimum", "eq",
                            "ne", "lt", "le", "gt", "ge", r"logical_\w+", r"bitwise_\w+", "__and__", "__or__", "__xor__",
                            "__invert__", "isfinite", "isnan", "isinf", "nan_to_num", "lerp", "addcmul", "addcdiv",
                            "erf", "floor", "ceil", "round", "trunc", "frac", "dropout"),
         "aten::add",
         "pointwise math, comparisons and activations (the rule table's last row: the rest is `other`)"),
    Rule(OTHER, _aten("view", "reshape", "_reshape_alias", "_unsafe_view", "as_strided", "slice", "select", "narrow",
                      "expand", "permute", "transpose", "t", "unsqueeze", "squeeze", "split", "split_with_sizes",
                      "chunk", "unbind", "detach", "alias", "real", "resolve_conj", "resolve_neg", "item",
                      "_local_scalar_dense", "result_type"),
         "aten::as_strided",
         "views and scalar reads: no data computed, only dispatch overhead; named here so the fall-through stays small"),
)

@cache
def _cpu_compiled() -> tuple[tuple[re.Pattern, str], ...]:
    """CPU_RULES compiled on first use: only traces without GPU events need them."""
    return tuple((re.compile(r.pattern), r.category) for r in CPU_RULES)


@lru_cache(maxsize=8192)
def classify_cpu_op(name: str) -> str:
    """Category of one CPU operator name (`aten::mm`); `other` when no CPU rule matches."""
    for pattern, category in _cpu_compiled():
        if pattern.search(name):
            return category
    return OTHER


def classify_cpu_op_names(names: pd.Series) -> pd.Series:
    """Vectorised over distinct names: [N] operator names -> [N] categories."""
    mapping = {n: classify_cpu_op(n) for n in pd.unique(names)}
    return names.map(mapping)

