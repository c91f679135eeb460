#!/usr/bin/env bash
# Build .anchor/libflashmla_anchor.so: FlashMLA's Hopper sparse FP8 decode (MODEL1, 64 and 128 heads), its
# scheduler and its combine, behind shim.cu's C ABI. FlashMLA's sources are not in this tree:
#   FLASHMLA=<checkout of deepseek-ai/FlashMLA at 9241ae3> CUTLASS=<NVIDIA/cutlass at 147f567, its
#   submodule pin> bash benchmarks/anchor_flashmla/build.sh
# Needs nvcc >= 12.8 (13.0 here); no GPU and no torch: the .so is carried to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${FLASHMLA:?set FLASHMLA to a FlashMLA checkout}" "${CUTLASS:?set CUTLASS to a cutlass checkout}"
mkdir -p .anchor
flags=(-O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -Wno-deprecated-declarations
       -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ -U__CUDA_NO_HALF2_OPERATORS__
       -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math
       -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC
       -I"$FLASHMLA/csrc" -I"$FLASHMLA/csrc/kerutils/include" -I"$FLASHMLA/csrc/sm90"
       -I"$CUTLASS/include" -I"$CUTLASS/tools/util/include")
srcs=("$FLASHMLA/csrc/sm90/decode/sparse_fp8/instantiations/model1_persistent_h64.cu"
      "$FLASHMLA/csrc/sm90/decode/sparse_fp8/instantiations/model1_persistent_h128.cu"
      "$FLASHMLA/csrc/smxx/decode/combine/combine.cu"
      "$FLASHMLA/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu"
      benchmarks/anchor_flashmla/shim.cu)
objs=() pids=()
for s in "${srcs[@]}"; do
    o=".anchor/$(basename "${s%.cu}").o"
    nvcc "${flags[@]}" -c "$s" -o "$o" &
    objs+=("$o") pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done  # set -e: the first failed compile stops the build
nvcc -shared -gencode arch=compute_90a,code=sm_90a "${objs[@]}" -o .anchor/libflashmla_anchor.so.tmp
mv .anchor/libflashmla_anchor.so.tmp .anchor/libflashmla_anchor.so
echo ".anchor/libflashmla_anchor.so built"
