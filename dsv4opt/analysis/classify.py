"""Kernel name -> category, as an ordered pattern table: first match wins.

Each row carries a real kernel name it was written for (from the traces in ../shared/traces; the
H200 name patterns of the shared model notes are tested in the test module); tests/analysis/test_classify.py checks every
example lands in its row's category. Patterns match the demangled name, case-insensitively.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from dsv4opt.analysis.categories import (
    ATTENTION, COMMUNICATION, COPY, ELEMENTWISE, GEMM_FP32_SIMT, GEMM_TC, MOE, OTHER, REDUCTION, TOPK_SORT,
)
from dsv4opt.analysis.names import demangle


@dataclass(frozen=True)
class Rule:
    category: str
    pattern: str
    example: str
    why: str = ""


# Order matters: more specific rules first (a grouped GEMM is MoE before it is a GEMM; an ffma
# xmma GEMM is SIMT before it is an xmma GEMM; a copy written as an elementwise functor is a copy).
RULES: tuple[Rule, ...] = (
    Rule(COMMUNICATION, r"nccl|rccl|all_?reduce|allgather|all_gather|reduce_?scatter|all_?to_?all|cross_device_reduce|one_shot|two_shot|mscclpp|deep_ep|dispatch_combine",
         "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"),
    Rule(MOE, r"grouped_?gemm|groupproblemshape|moe|expert|topk_softmax|topkgating|moe_align|count_and_sort_expert|group_gemm|m_grouped|grouped_mm",
         "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, ...> >(...)",
         "grouped GEMMs and expert routing"),
    Rule(ATTENTION, r"flash|fmha|sdpa|mla|attn|attention|batchdecode|batchprefill|paged_?attention|decode_?kernel|_fwd_kernel_stage|merge_state|single_decode|cascade",
         "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, ...>, false, true, false, false, true, true, false>(pytorch_flash::Flash_fwd_params)"),
    Rule(GEMM_FP32_SIMT, r"sgemm|simt|_ffma|ffma_|gemm_f32f32_f32f32|scudnn|gemv.*<float|gemvx?_?kernel.*\bfloat\b|gemmsn_.*float|gemmk1_kernel<.*float|^cijk_(?!.*_mi\d)",
         "volta_sgemm_64x64_nt",
         "FP32 GEMM/GEMV on CUDA cores (also cuDNN's FP32 scudnn convolutions)"),
    Rule(GEMM_TC, r"(?<!fb)gemm|gemv|nvjet|tensorop|xmma|hmma|wgmma|cutlass|cublas|^cijk_|ck_tile.*gemm|matmul|triton_mm|triton_tem_|_mm_|tl_dot|bmm|splitkreduce|cudnn.*conv|implicit_convolve|dgrad|wgrad",
         "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
         "tensor-core GEMM/GEMV, tf32 included (s1688gemm), Triton tl.dot matmuls"),
    Rule(REDUCTION, r"^triton_(?:red|per)_",
         "triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1",
         "Inductor reductions by their prefix, whatever they fuse (their names often say _to_copy)"),
    Rule(ELEMENTWISE, r"^triton_poi_",
         "triton_poi_fused__unsafe_view_mul_silu_2",
         "Inductor pointwise kernels by their prefix"),
    Rule(TOPK_SORT, r"topk|top_k|sort|radix|argsort|bitonic|segmented_sort|gathertopk",
         "void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, int>::Policy800, false, long, int, int, int>(...)"),
    Rule(COPY, r"^memcpy|^memset|copy|catarray|\bcat_|gather|scatter|index|(?<!rotary_)embedding|fill|permute|transpose|store_kvcache|concat|\bstack|unfold|im2col|nchwtonhwc|nhwctonchw",
         "Memcpy HtoD (Pinned -> Device)",
         "memcpy, memset, copy/cat/gather/index/fill kernels (dtype conversion copies included)"),
    Rule(REDUCTION, r"reduce|norm|softmax|triton_red_|triton_per_|_per_fused|mean|argmax|argmin|\bsum\b|cumsum|scan|welford|bn_|batch_norm|gammabeta",
         "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >(...)"),
    Rule(ELEMENTWISE, r"elementwise|triton_poi_|_poi_fused|functor|unrolled|vectorized|activation|act_and_mul|silu|gelu|relu|sigmoid|tanh|rotary|rope|pointwise|multi_tensor_apply|threshold|clamp|pool",
         "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"),
)

_COMPILED = tuple((re.compile(r.pattern, re.IGNORECASE), r.category) for r in RULES)


@lru_cache(maxsize=65536)
def classify(name: str) -> str:
    """Category of one kernel name (mangled or not); `other` when no rule matches."""
    text = _searchable(name)
    for pattern, category in _COMPILED:
        if pattern.search(text):
            return category
    return OTHER


def classify_names(names: pd.Series) -> pd.Series:
    """Vectorised over distinct names: [N] names -> [N] categories."""
    distinct = pd.unique(names)
    mapping = {n: classify(n) for n in distinct}
    return names.map(mapping)


def _searchable(name: str) -> str:
    """The demangled name, plus the raw symbol when demangling fell back to the bare prefix (the
    template arguments, e.g. GroupProblemShape of a grouped GEMM, then live only in the raw text)."""
    text = demangle(name)
    return f"{text}\n{name}" if name.startswith("_Z") and "(" not in text else text


def matching_rule(name: str) -> Rule | None:
    text = _searchable(name)
    for rule, (pattern, _) in zip(RULES, _COMPILED):
        if pattern.search(text):
            return rule
    return None
