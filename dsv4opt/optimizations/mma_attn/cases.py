"""The correctness table of the attention slot: named shapes, layouts and slot patterns, and their inputs.

Shared by the correctness gate (check.py), the tests and the GPU scripts so all three run the
same function on the same awkward inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4opt.workload.kvcache import KVCache, KVLayout

PATTERNS = ("all", "half_unused", "one_empty", "short")
# SGLang's CUDA-graph decode sizes the compressed cache's index rows to the model's context (8192
# slots on an HCA layer at 1M), valid only up to each request's length: "graph" rows are `topk`
# wide with at most 2 x GRAPH_VALID used slots (64: an 8K context's HCA entries), holes of -1 among
# them, every slot past the length holding a real token (read it and the result is wrong), and the
# last request with none used; the window rows are short, with holes.
GRAPH = "graph"
GRAPH_VALID = 64


@dataclass(frozen=True)
class AttnCase:
    """One row of the table: `window` slots of the window cache, `topk` of the compressed cache
    (0: a window-only layer, no compressed cache), in the FP8 or bf16 KV layout."""

    batch: int
    topk: int
    pattern: str  # one of PATTERNS, or GRAPH
    window: int = 128
    heads: int = 64
    dim: int = 512
    rope_dim: int = 64
    tile: int = 64
    layout: str = "fp8"

    @property
    def name(self) -> str:
        return f"B{self.batch}-W{self.window}-K{self.topk}-{self.pattern}-H{self.heads}-D{self.dim}-{self.layout}"


def gpu_cases() -> list[AttnCase]:
    """The full table at the model's sizes (64 heads of 512): every B x K x pattern in the FP8
    layout, a window-only row per B, and the bf16 layout on a few rows."""
    cases = [AttnCase(b, k, p) for b in (1, 3, 32, 64) for k in (1, 100, 512) for p in PATTERNS]
    cases += [AttnCase(b, 0, p) for b in (1, 64) for p in ("all", "short")]
    cases += [AttnCase(b, 512, p, layout="bf16") for b in (3, 64) for p in ("all", "short")]
    # graph width: B = 1 on the block-level kernel, B = 32 on a warp-specialised loop with some of its
    # four splits idle (the float64 reference decodes every slot of the rows: 2.2 GB of float64 at B = 64)
    cases += [AttnCase(b, 8192, GRAPH) for b in (1, 32)] + [AttnCase(32, 8192, GRAPH, layout="bf16")]
    return cases


def interpreter_cases() -> list[AttnCase]:
    """Small enough for Triton's interpreter on a CPU: fewer heads and a narrow latent, plus one
    case at the real width D = 512 with small B and K."""
    small = dict(heads=8, dim=64, rope_dim=16, tile=16, window=16)
    cases = [AttnCase(b, k, p, **small) for b, k in ((1, 1), (3, 37)) for p in PATTERNS]
    cases += [AttnCase(3, 0, "short", **small), AttnCase(3, 37, "half_unused", layout="bf16", **small)]
    cases += [AttnCase(2, 40, "half_unused", heads=16, window=16), AttnCase(3, 256, GRAPH, **small)]
    return cases


@dataclass(frozen=True)
class AttnInputs:
    q: torch.Tensor  # [B, H, D]
    swa: KVCache
    swa_indices: torch.Tensor  # [B, W] int32
    swa_lengths: torch.Tensor  # [B] int32
    extra: KVCache | None
    extra_indices: torch.Tensor | None  # [B, K] int32
    extra_lengths: torch.Tensor | None
    sink: torch.Tensor  # [H] fp32
    scale: float

    def args(self) -> tuple:
        return (self.q, self.swa, self.swa_indices, self.swa_lengths, self.extra, self.extra_indices,
                self.extra_lengths, self.sink, self.scale)


def _cache(case: AttnCase, tokens: int, page: int, dtype, gen) -> KVCache:
    layout = KVLayout(case.layout == "fp8", case.dim - case.rope_dim, case.rope_dim, case.tile, page)
    cache = KVCache.allocate(layout, -(-tokens // page), dtype, "cpu")
    cache.write(torch.arange(cache.tokens), torch.randn(cache.tokens, case.dim, generator=gen))
    return cache


def _slots(case: AttnCase, width: int, pool: int, gen) -> tuple[torch.Tensor, torch.Tensor]:
    B = case.batch
    indices = torch.stack([torch.randperm(pool, generator=gen)[:width] for _ in range(B)]).to(torch.int32)
    lengths = torch.full((B,), width, dtype=torch.int32)
    if case.pattern == GRAPH:
        if width == case.window:  # the window: mostly full
            lengths = torch.randint(width // 2, width + 1, (B,), generator=gen, dtype=torch.int32)
        else:
            lengths = torch.randint(1, min(width // 4, 2 * GRAPH_VALID) + 1, (B,), generator=gen, dtype=torch.int32)
            lengths[-1] = 0 if B > 1 else lengths[-1]
        holes = torch.rand(B, width, generator=gen) < 0.125
        indices[holes & (torch.arange(width) < lengths[:, None])] = -1  # only inside the used prefix
    elif case.pattern == "half_unused":
        indices[torch.rand(B, width, generator=gen) < 0.5] = -1
    elif case.pattern == "one_empty":
        indices[0] = -1
        lengths[-1] = 0 if B > 1 else lengths[-1]
    elif case.pattern == "short":
        lengths = torch.randint(0, width, (B,), generator=gen, dtype=torch.int32) if width > 1 else torch.zeros(B, dtype=torch.int32)
    elif case.pattern != "all":
        raise ValueError(f"unknown pattern {case.pattern!r}")
    return indices, lengths


def make_inputs(case: AttnCase, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> AttnInputs:
    """Random inputs for one case: a window cache of B pages and a compressed cache of
    max(4096, 4K) tokens, distinct random tokens of each per request."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    B, K, H, D, W = case.batch, case.topk, case.heads, case.dim, case.window
    q = torch.randn(B, H, D, generator=gen)
    sink = torch.randn(H, generator=gen)
    swa = _cache(case, B * 2 * W, 2 * W, dtype, gen)
    swa_indices, swa_lengths = _slots(case, W, swa.tokens, gen)
    extra = extra_indices = extra_lengths = None
    if K:
        extra = _cache(case, max(4096, 4 * K), 64, dtype, gen)
        extra_indices, extra_lengths = _slots(case, K, extra.tokens, gen)
        extra = KVCache(extra.layout, extra.data.to(device))
        extra_indices, extra_lengths = extra_indices.to(device), extra_lengths.to(device)
    return AttnInputs(
        q=q.to(device, dtype), swa=KVCache(swa.layout, swa.data.to(device)), swa_indices=swa_indices.to(device),
        swa_lengths=swa_lengths.to(device), extra=extra, extra_indices=extra_indices, extra_lengths=extra_lengths,
        sink=sink.to(device), scale=D**-0.5,
    )
