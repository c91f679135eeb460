"""The slots where optimisations plug into the decode step: names, contracts and references.

The model never names a kernel: it is built with one callable per slot (`DecodeWorkload(impls=)`),
the baseline's (`dsv4opt.workload.baseline.IMPLEMENTATIONS`) unless an optimisation replaces one.
Every implementation of a slot computes the function its float64 reference defines.

attention(q, swa, swa_indices, swa_lengths, extra, extra_indices, extra_lengths, sink, scale) -> (o, lse)
    The contract of SGLang's sm_120 entry point `flash_mla_sparse_decode_triton` (window cache,
    then compressed cache, sink).
    q:             [B, H, D] model dtype; D = nope + rope (448 + 64)
    swa, extra:    KVCache (dsv4opt/workload/kvcache.py): the layer's window cache and its compressed
                   cache (None on window-only layers), FP8 or bf16 layout
    *_indices:     [B, K] int32 token numbers of the cache (-1: unused slot)
    *_lengths:     [B] int32; slots at positions >= lengths[b] are unused as well
    sink:          [H] fp32 per-head attention-sink logit (adds exp(sink) to the denominator)
    o:             [B, H, D] in q's dtype: softmax-weighted sum of the used rows (0 when none)
    lse:           [B, H] fp32 = log(exp(sink) + sum exp(scale * q . row)) (natural log)
    reference:     dsv4opt.workload.attention.naive.sparse_attention_ref

indexer_logits(q8, weights, cache, seq_lens, page_table, max_len) -> logits
    The contract of SGLang's `fp8_paged_mqa_logits` (the lightning indexer's scores).
    q8:            [B, Hi, Di] e4m3 index queries (Hadamard-rotated, one scale per head folded into weights)
    weights:       [B, Hi] fp32 head weights
    cache:         IndexKeyCache, pages of e4m3 keys with one fp32 scale each
    seq_lens:      [B] int32 entries each request has; page_table: [B, P] int32 pages of each request
    logits:        [B, max_len] fp32 = scale_s * sum_h weights_h * relu(q8_h . key_s); -inf at s >= seq_lens[b]
    reference:     dsv4opt.workload.kernels.naive.index_logits

indexer_topk(q8, weights, cache, seq_lens, page_table, base, topk, logits) -> indices
    The indexer's scores and their top-k: what SGLang runs as `fp8_paged_mqa_logits` then
    `topk_transform` (dsv4/indexer.py:1078-1099). The baseline calls `logits` over the page table's
    width, then `topk_transform`; an implementation that scores the entries itself ignores `logits`.
    q8 .. page_table: as indexer_logits
    base:          [B] int32 the request's first entry in the cache (the indices' offset)
    topk:          entries kept a request
    logits:        the step's `indexer_logits` implementation (may be None for one that ignores it)
    indices:       [B, topk] int32: base[b] + s for the top-`topk` of indexer_logits' scores among
                   s < seq_lens[b] (all of them when seq_lens[b] <= topk), -1 after; the entries
                   that exist come first, in no particular order
    reference:     dsv4opt.workload.kernels.naive.index_topk

hc_premix(x, weight) -> mix
    x:             [T, n * hidden] fp32, the flattened residual copies (not yet normalised)
    weight:        [2n + n*n, n * hidden] fp32 pre-mix projection
    mix:           [T, 2n + n*n] fp32 = x @ weight^T (the caller multiplies by the RMS factor)
    reference:     dsv4opt.workload.kernels.naive.mm_out_fp32 (float64 inputs)

routed_experts(x, local_ids, gates, w13, w2, limit, scale) -> out
    The contract of SGLang's `mxfp4_moe_forward_triton` (the routed experts of one rank).
    x:             [M, d] model dtype, the gathered tokens of every DP rank
    local_ids:     [M, k] int32 local expert of each (token, top-k) slot; -1: an expert of another rank
    gates:         [M, k] fp32 routing weights
    w13, w2:       Mxfp4Experts [R, 2I, d] (gate rows then up rows) and [R, d, I] of this rank
    limit:         SwiGLU clamp: act = silu(min(gate, limit)) * clamp(up, -limit, limit)
    out:           [M, d] in x's dtype = scale * sum_j gates[m, j] * w2[e] @ act(w13[e] @ x[m]) over the
                   slots j with e = local_ids[m, j] >= 0 (SGLang's path multiplies by scale inside)
    reference:     dsv4opt.workload.kernels.naive.routed_experts (float64 inputs)

regions(block, impls) -> run
    How each block of the step (one layer's attention or FFN block) runs.
    block:         the workload's bound method (layer, h, meta) -> h
    impls:         the slot implementations the block calls
    run:           a callable with block's signature computing what block computes
    reference:     dsv4opt.workload.baseline.as_written (the block itself, op by op)

The glue slots: each is one run of eager operations between two kernels of the step (a region
`dsv4opt glue` finds), SGLang's eager torch in the baseline (dsv4opt/workload/glue.py).

hc_split_sum(mix, rsqrt, flat, scale, base, hc, iters, eps, dtype) -> (x, post, comb)
    The hyper-connection pre-mix after its linear.
    mix:           [T, 2hc + hc*hc] fp32, the pre-mix linear's output (before the RMS factor)
    rsqrt:         [T] fp32 RMS factor of the flattened copies; flat: [T, hc * hidden] fp32 the copies
    scale, base:   [3], [2hc + hc*hc] fp32
    x:             [T, hidden] in `dtype` = sum_i pre_i * copy_i, pre = sigmoid(mix * rsqrt * scale0 + base) + eps
    post, comb:    [T, hc], [T, hc, hc] fp32: hc_split_sinkhorn of mix * rsqrt
    reference:     dsv4opt.workload.kernels.naive.hc_split_sum

moe_local(ids, owner, row_rank) -> local_ids
    SGLang's global -> local expert map of the gathered rows (token_dispatcher/standard.py:169-212).
    ids:           [M, k] int32 global experts; owner: [EP, E] int32 local set on each rank (-1: none)
    row_rank:      [M] int64 the rank whose token each row is
    local_ids:     [M, k] int32 = owner[row_rank[m], ids[m, j]] (routed_experts' local_ids)
    reference:     dsv4opt.workload.kernels.naive.moe_local
"""

from __future__ import annotations

SLOTS = ("attention", "indexer_logits", "indexer_topk", "hc_premix", "routed_experts", "hc_split_sum", "moe_local",
         "regions")


def with_overrides(base: dict, overrides: dict) -> dict:
    """The baseline's implementations with `overrides` in place of theirs; unknown slots are a bug."""
    unknown = set(overrides) - set(SLOTS)
    assert not unknown, f"unknown slots {unknown}"
    return {**base, **overrides}
