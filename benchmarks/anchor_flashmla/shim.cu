// A C ABI over FlashMLA's Hopper sparse FP8 decode (the MODEL1 layout, 64 or 128 heads), so that
// benchmarks/bench_flashmla_anchor.py can time it on the inputs `dsv4opt bench mma-attn --kv fp8`
// uses, in the same run. Built by build.sh against FlashMLA's own sources (not part of this tree):
// the decode kernel, its scheduler-metadata kernel and its split combine, called in the order
// FlashMLA's own sparse_attn_decode_interface calls them (csrc/api/sparse_decode.h there).
#include <cstdio>
#include <exception>

#include "params.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

extern "C" {

// Everything one call needs: raw device pointers and element strides, laid out as the Python
// side's ctypes.Structure of the same name. "main" is the window cache, "extra" the compressed one.
struct AnchorArgs {
    int b, h_q, num_sm_parts;
    float sm_scale;
    void *q;
    int stride_q_b, stride_q_h;
    void *kv;
    int num_blocks, page_block_size, stride_kv_block, topk;
    int *indices;
    int stride_indices_b;
    int *topk_length;
    void *extra_kv;
    int extra_num_blocks, extra_page_block_size, stride_extra_kv_block, extra_topk;
    int *extra_indices;
    int stride_extra_indices_b;
    int *extra_topk_length;
    float *sink;
    float *lse;       // [b, h_q]
    void *out;        // [b, h_q, 512] bf16
    float *lse_accum; // [b + num_sm_parts, h_q]
    float *o_accum;   // [b + num_sm_parts, h_q, 512]
    void *sched;      // [num_sm_parts, DecodingSchedMetaSize / 4] int32
    int *num_splits;  // [b + 1]
    void *stream;
};

int anchor_sched_meta_size() { return DecodingSchedMetaSize; }

// FlashMLA's Decode_Sm90_Impl::get_meta: SMs / (heads / 64) parts (the caller's num_sm_parts),
// 5 blocks of fixed overhead, 64-token blocks.
int anchor_sched(const AnchorArgs *a) {
    try {
        GetDecodeSchedMetaParams p = {
            a->b, 1, 64, 5, a->topk, a->extra_topk, a->topk_length, a->extra_topk_length, nullptr,
            (DecodingSchedMeta *)a->sched, a->num_splits, a->num_sm_parts, (cudaStream_t)a->stream,
        };
        smxx::decode::run_get_decoding_sched_meta_kernel(p);
    } catch (const std::exception &e) {
        fprintf(stderr, "anchor_sched: %s\n", e.what());
        return 1;
    }
    return 0;
}

// The decode kernel then the combine; the scheduler metadata must have been computed. FlashMLA's
// decode path throws on a bad argument (caught below), but its combine checks with FLASH_ASSERT and
// CHECK_CUDA, which exit the process: refuse here what the combine would (it has instances for up to
// 160 parts) so that the caller gets a return code.
int anchor_decode(const AnchorArgs *a) {
    if (a->num_sm_parts < 1 || a->num_sm_parts > 160) {
        fprintf(stderr, "anchor_decode: %d scheduler parts; FlashMLA's combine takes 1 to 160\n", a->num_sm_parts);
        return 1;
    }
    using bf16 = cutlass::bfloat16_t;
    const int d = 512, bytes_per_token = 448 + 2 * 64 + 8;
    try {
        SparseAttnDecodeParams p = {};
        p.b = a->b; p.s_q = 1; p.h_q = a->h_q; p.h_kv = 1; p.d_qk = d; p.d_v = d;
        p.sm_scale = a->sm_scale; p.sm_scale_div_log2 = a->sm_scale * 1.4426950408889634f;
        p.num_blocks = a->num_blocks; p.page_block_size = a->page_block_size; p.topk = a->topk;
        p.model_type = ModelType::MODEL1;
        p.q = (bf16 *)a->q; p.kv = (bf16 *)a->kv; p.indices = a->indices; p.topk_length = a->topk_length;
        p.attn_sink = a->sink; p.lse = a->lse; p.out = (bf16 *)a->out;
        p.extra_num_blocks = a->extra_num_blocks; p.extra_page_block_size = a->extra_page_block_size;
        p.extra_topk = a->extra_topk; p.extra_kv = (bf16 *)a->extra_kv; p.extra_indices = a->extra_indices;
        p.extra_topk_length = a->extra_topk_length;
        p.stride_q_b = a->stride_q_b; p.stride_q_s_q = a->stride_q_b; p.stride_q_h_q = a->stride_q_h;
        p.stride_kv_block = a->stride_kv_block; p.stride_kv_row = bytes_per_token;
        p.stride_indices_b = a->stride_indices_b; p.stride_indices_s_q = a->stride_indices_b;
        p.stride_lse_b = a->h_q; p.stride_lse_s_q = a->h_q;
        p.stride_o_b = a->h_q * d; p.stride_o_s_q = a->h_q * d; p.stride_o_h_q = d;
        p.stride_extra_kv_block = a->stride_extra_kv_block; p.stride_extra_kv_row = bytes_per_token;
        p.stride_extra_indices_b = a->stride_extra_indices_b; p.stride_extra_indices_s_q = a->stride_extra_indices_b;
        p.stream = (cudaStream_t)a->stream;
        p.lse_accum = a->lse_accum; p.o_accum = a->o_accum;
        p.stride_lse_accum_split = a->h_q; p.stride_lse_accum_s_q = a->h_q;
        p.stride_o_accum_split = a->h_q * d; p.stride_o_accum_s_q = a->h_q * d; p.stride_o_accum_h_q = d;
        p.tile_scheduler_metadata_ptr = (DecodingSchedMeta *)a->sched; p.num_splits_ptr = a->num_splits;
        p.num_sm_parts = a->num_sm_parts;
        if (a->h_q == 64) {
            sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1, 64>(p);
        } else if (a->h_q == 128) {  // two CTAs a request as a cluster, sharing the dequantised tile
            sm90::decode::sparse_fp8::run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1, 128>(p);
        } else {
            fprintf(stderr, "anchor_decode: %d heads; FlashMLA's Hopper kernel has 64 or 128\n", a->h_q);
            return 1;
        }

        CombineParams c = {
            p.b, p.s_q, p.h_q, p.d_v, p.lse, p.out, p.stride_lse_b, p.stride_lse_s_q,
            p.stride_o_b, p.stride_o_s_q, p.stride_o_h_q, p.lse_accum, p.o_accum,
            p.stride_lse_accum_split, p.stride_lse_accum_s_q, p.stride_o_accum_split,
            p.stride_o_accum_s_q, p.stride_o_accum_h_q, p.tile_scheduler_metadata_ptr,
            p.num_splits_ptr, p.num_sm_parts, a->sink, p.stream,
        };
        smxx::decode::run_flash_mla_combine_kernel<bf16>(c);
    } catch (const std::exception &e) {
        fprintf(stderr, "anchor_decode: %s\n", e.what());
        return 1;
    }
    return 0;
}

}  // extern "C"
