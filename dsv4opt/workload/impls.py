"""The slots where optimisations plug into the model, and how the model picks an implementation.

The model never names a kernel: it asks `resolve(optimizations)` once and calls what it gets.
Every implementation of a slot computes the same function (its naive reference in
dsv4opt/workload/naive.py) with the same signature:

attention(q, kv, indices, lengths, sink, scale) -> (o, lse)
    q:       [B, H, D] bf16 (fp16 in interpreter tests); D = 512 (448 nope + 64 rope)
    kv:      [N, D] latent KV pool of one layer in the model dtype (rows are cache entries;
             K = V = the latent). The workload lays it out as C blocks of M compressed slots then
             the W-slot window ring; indices are absolute rows of this [N, D] view
    indices: [B, K] int32 rows of `kv` to attend to; -1 marks an unused slot
    lengths: [B] int32; slots at positions >= lengths[b] are unused as well
    sink:    [H] fp32 per-head attention-sink logit (adds exp(sink) to the softmax denominator)
    scale:   float softmax scale
    o:       [B, H, D] in q's dtype = sum_k softmax_k * kv[indices[b, k]]; zero when no slot is used
    lse:     [B, H] fp32 = log(exp(sink) + sum_k exp(scale * q . kv[k])) (natural log)

indexer_score(q, k, k_scale, w) -> scores
    q:       [B, Hi, Di] bf16 index queries (Hi = 64, Di = 128)
    k:       [B, S, Di] float8_e4m3fn index keys of each request's compressed entries; S is the
             allocated slot count, entries past a request's live count hold stale values
    k_scale: [B, S] fp32 per-entry dequantisation scale
    w:       [B, Hi] fp32 per-head weights
    scores:  [B, S] fp32 = sum_j w[b, j] * relu(q[b, j] . (k[b, s] * k_scale[b, s]))
    (the caller masks entries beyond each request's length and takes the top-k)

hc_premix(x, weight) -> mix
    x:       [T, n * hidden] fp32, the RMS-normalised flattened residual copies
    weight:  [24, n * hidden] the pre-mix projection (stored as the baseline wants it)
    mix:     [T, 24] fp32
"""

from __future__ import annotations

from typing import Callable, Iterable

SLOTS = ("attention", "indexer_score", "hc_premix")


def resolve(optimizations: Iterable[str]) -> dict[str, Callable]:
    """Baseline implementations, overridden by each enabled optimisation's in registry order."""
    from dsv4opt.optimizations.registry import get
    from dsv4opt.workload.baseline import IMPLEMENTATIONS

    impls = dict(IMPLEMENTATIONS)
    for name in optimizations:
        provided = get(name).implementations()
        unknown = set(provided) - set(SLOTS)
        assert not unknown, f"{name} provides unknown slots {unknown}"
        impls.update(provided)
    return impls
