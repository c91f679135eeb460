"""The gate's table of indexer inputs: shapes, request lengths and score distributions.

Each case is the `indexer_topk` slot's arguments: e4m3 queries and keys with one fp32 scale each
(the query's folded into the head weights, as index_q_rope_hadamard_quant does), a paged key cache
whose pages are dealt to the requests in a shuffled order, a page table as wide as `width_pages`
(past a request's own pages its entries are page 0, as SGLang's graph-wide table has them) and
each request's first entry number as base.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4opt.workload.kvcache import IndexKeyCache, quantize_index_key

SCENARIOS = ("iid", "clustered", "heavy_tailed", "near_ties")


@dataclass(frozen=True)
class IndexerCase:
    name: str
    heads: int
    dim: int
    page: int  # entries a page of the key cache
    topk: int
    lengths: tuple[int, ...]  # entries of each request (the batch is their number)
    scenario: str = "iid"
    width_pages: int = 0  # the page table's width; 0: as many as the longest request needs

    @property
    def batch(self) -> int:
        return len(self.lengths)


def interpreter_cases() -> list[IndexerCase]:
    """Small enough for Triton's interpreter; every awkward length and shape the slot can see."""
    awkward = (0, 1, 15, 16, 17, 31, 33, 64, 100, 5, 16, 2, 47, 0, 63, 18, 129)  # top-16, pages of 16
    return [
        IndexerCase("batch1-one-request", 8, 32, 16, 16, (100,)),
        IndexerCase("batch3-empty-one-and-exact-topk", 8, 32, 16, 16, (0, 1, 16)),
        IndexerCase("batch3-just-over-topk-not-page-multiple", 20, 48, 16, 16, (17, 33, 70)),
        IndexerCase("batch17-awkward-lengths", 8, 32, 16, 16, awkward),
        IndexerCase("graph-width-table", 8, 32, 16, 16, (40, 3, 90), width_pages=32),
        IndexerCase("topk-not-pow2-page4", 4, 16, 4, 6, (5, 6, 7, 23)),
        IndexerCase("flash-widths-clustered", 64, 128, 64, 512, (2048, 700, 513, 512), "clustered"),
        IndexerCase("flash-widths-near-ties", 64, 128, 64, 512, (1100, 600), "near_ties"),
        IndexerCase("heavy-tailed", 16, 64, 16, 32, (300, 257, 31, 200), "heavy_tailed"),
    ]


def gpu_cases() -> list[IndexerCase]:
    """dsv4-flash widths at the profile's default context (2048 entries = 8192 tokens) in the four
    scenarios, at SGLang's graph width (1M tokens: 4096 pages of 64 entries), and a long context."""
    flash = dict(heads=64, dim=128, page=64, topk=512)
    default = (2048, 2048, 2047, 1537, 1024, 513, 512, 1)
    out = [IndexerCase(f"flash-{s}", scenario=s, lengths=default, **flash) for s in SCENARIOS]
    out.append(IndexerCase("flash-graph-width", lengths=(2048,) * 15 + (3,), width_pages=4096, **flash))
    out.append(IndexerCase("flash-128k-context", lengths=(32768, 32001, 9000), **flash))
    return out + [c for c in interpreter_cases() if not c.name.startswith("flash")]


def make_inputs(case: IndexerCase, device, seed: int = 0) -> dict:
    """The slot's arguments for `case` on `device` (a dict with the slot's parameter names)."""
    gen = torch.Generator().manual_seed(seed)
    B, H, D, page = case.batch, case.heads, case.dim, case.page
    own = [-(-n // page) for n in case.lengths]
    S = max(max(own, default=0), 1) * page
    q, keys, scale_noise = _scenario(case.scenario, B, H, D, S, gen)
    q8, q_scale = quantize_index_key(q.reshape(B * H, D))
    k8, k_scale = quantize_index_key(keys.reshape(B * S, D))
    if scale_noise is not None:
        k_scale = k_scale * scale_noise.reshape(-1)
    weights = torch.randn(B, H, generator=gen) * (H * D) ** -0.5 * q_scale.view(B, H)
    pages = sum(own) + 1  # page 0 stays a spare the graph-wide table points at past a request's own
    order = 1 + torch.randperm(pages - 1, generator=gen)
    width = max(case.width_pages, max(own, default=0), 1)
    table = torch.zeros(B, width, dtype=torch.int32)
    cache = IndexKeyCache.allocate(D, page, pages, "cpu")
    cache.fill_random(gen)
    first = 0
    for b, n_pages in enumerate(own):
        mine = order[first : first + n_pages]
        table[b, :n_pages] = mine.int()
        first += n_pages
        s = torch.arange(case.lengths[b])
        cache.write(mine[s // page] * page + s % page, k8.view(B, S, D)[b, : case.lengths[b]],
                    k_scale.view(B, S)[b, : case.lengths[b]])
    base = torch.randint(0, 1 << 20, (B,), generator=gen, dtype=torch.int32)
    cache = IndexKeyCache(D, page, cache.data.to(device))
    return {"q8": q8.view(B, H, D).to(device), "weights": weights.to(device), "cache": cache,
            "seq_lens": torch.tensor(case.lengths, dtype=torch.int32).to(device), "page_table": table.to(device),
            "base": base.to(device), "topk": case.topk}


def args(inp: dict) -> tuple:
    """The slot's positional arguments (no `logits`)."""
    return (inp["q8"], inp["weights"], inp["cache"], inp["seq_lens"], inp["page_table"], inp["base"], inp["topk"])


def _scenario(name: str, B: int, H: int, D: int, S: int, gen: torch.Generator):
    """(queries [B, H, D], keys [B, S, D], key-scale factors [B, S] or None) of a score distribution."""
    def randn(*size):
        return torch.randn(*size, generator=gen)

    if name == "iid":
        return randn(B, H, D), randn(B, S, D), None
    if name == "clustered":  # keys around a few centroids: a crowded top-k boundary
        centroids = randn(B, 16, D)
        member = torch.randint(0, 16, (B, S), generator=gen)
        keys = torch.gather(centroids, 1, member.unsqueeze(-1).expand(-1, -1, D)) + 0.05 * randn(B, S, D)
        return randn(B, H, D), keys, None
    if name == "heavy_tailed":  # Student-t(2) with outlier channels: per-entry scales vary widely
        k, q = _student_t(gen, (B, S, D)), _student_t(gen, (B, H, D))
        k[..., :4] *= 20.0
        q[..., :4] *= 5.0
        return q, k, None
    if name == "near_ties":  # groups of 8 equal keys whose scales differ by 1e-6..1e-4 relative
        keys = randn(B, -(-S // 8), D).repeat_interleave(8, dim=1)[:, :S]
        noise = 1 + torch.logspace(-6, -4, S).unsqueeze(0) * randn(B, S).sign()
        return randn(B, H, D), keys, noise
    raise ValueError(f"unknown scenario {name!r}")


def _student_t(gen: torch.Generator, size: tuple[int, ...], df: int = 2) -> torch.Tensor:
    z = torch.randn(*size, generator=gen)
    chi2 = torch.randn(*size, df, generator=gen).square().sum(-1)
    return z / torch.sqrt(chi2 / df)
