"""The inputs every mma-attn bench times on: the model's attention shape, a KV pool far above L2,
window caches, independent input sets that together select several L2s of rows, and a call that
rotates through them (bench.py's tables and bench_peers.py's FlashMLA comparison both use these).
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch

from dsv4opt.optimizations.timing import sets_needed
from dsv4opt.workload.config import ModelConfig

# dsv4-flash attention (docs/kernels/mma_attn.md): 64 heads, latent 512 (448 nope + 64 rope),
# top-512 compressed entries plus the 128-token window, each in its own cache.
_CFG = ModelConfig.from_name("dsv4-flash")
HEADS = _CFG.heads
DIM = _CFG.head_dim
ROPE = _CFG.rope_dim
TILE = _CFG.kv_tile
TOPK = _CFG.index_topk
WINDOW = _CFG.window
WINDOW_PAGE = _CFG.window_page
EXTRA_PAGE = _CFG.extra_page("csa")
POOL_GB = 4.0


def _layout(kv: str, page: int):
    from dsv4opt.workload.kvcache import KVLayout

    return KVLayout(kv == "fp8", DIM - ROPE, ROPE, TILE, page)


def pool_cache(kv: str, gen: torch.Generator, pool_gb: float = POOL_GB, device="cuda"):
    """The compressed cache the timed calls gather from: pool_gb of random rows, far above L2."""
    from dsv4opt.workload.kvcache import KVCache

    layout = _layout(kv, EXTRA_PAGE)
    cache = KVCache.allocate(layout, int(pool_gb * 2**30) // (layout.token_bytes * EXTRA_PAGE), torch.bfloat16, device)
    cache.fill_random(gen)
    return cache


def window_cache(kv: str, batch: int, gen: torch.Generator, device="cuda"):
    """A window cache of one page per request, random rows."""
    from dsv4opt.workload.kvcache import KVCache

    cache = KVCache.allocate(_layout(kv, WINDOW_PAGE), batch, torch.bfloat16, device)
    cache.fill_random(gen)
    return cache


def bench_inputs(batch: int, swa, extra, gen: torch.Generator):
    """Inputs for one batch size: distinct random tokens of each cache per request, every slot used."""
    def pick(cache, width):
        n = cache.tokens
        idx = torch.stack([torch.randperm(n, device="cuda", generator=gen)[:width] for _ in range(batch)])
        return idx.to(torch.int32), torch.full((batch,), width, device="cuda", dtype=torch.int32)

    q = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    sink = torch.randn(HEADS, device="cuda", generator=gen)
    return (q, *pick(swa, WINDOW), *pick(extra, TOPK), sink)


def input_sets(batch: int, swa, extra, gen: torch.Generator) -> list[tuple]:
    """Independent input sets that together select L2_SPAN times the L2's size in KV rows."""
    per_call = batch * (TOPK + WINDOW) * extra.layout.token_bytes
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    sets = [bench_inputs(batch, swa, extra, gen) for _ in range(sets_needed(per_call, l2_bytes))]
    # do_bench_cudagraph runs on a stream of its own, with no wait on this one: without this the
    # first calls can read indices that randperm has not written yet, and gather past the pool.
    torch.cuda.synchronize()
    return sets


def rotating(fn: Callable, swa, extra, sets: list[tuple], scale: float) -> Callable[[], object]:
    """A call of fn on the next input set each time; a graph captured over many calls keeps the
    order, so its replays cycle through the sets too."""
    cycle = itertools.cycle(sets)

    def call():
        q, swa_idx, swa_len, idx, lengths, sink = next(cycle)
        return fn(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale)

    return call
