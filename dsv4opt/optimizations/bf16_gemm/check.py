"""The gate for bf16-gemm: does the model still see the same tokens and compute the same thing?

Numeric error alone does not protect the model: the indexer decides which top-k entries attention
reads. So against the float32 path this measures (bounds and why: docs/optimizations/bf16_gemm.md)
- top-k recall of the indexer on score distributions that make selection hard (near-ties, clustered
  and heavy-tailed keys, long contexts), and the attention mass the dropped entries carried;
- relative error of the hyper-connection pre/post/comb numbers after the Sinkhorn split;
- in the model, block by block: each attention and MoE block run with bf16-gemm and with the
  float32 path on the same input and state, over decode steps. Comparing blocks, not whole steps,
  keeps the random-weight model's chaotic dynamics out of the figure (a perturbation compounds over
  43 layers and many steps into an O(1) change whatever its source).
Every bounded figure is "bad when large", so one rule applies: pass iff each is <= its bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.numerics import error_report
from dsv4opt.optimizations.bf16_gemm import naive
from dsv4opt.optimizations.registry import CheckResult, get

NAME = "bf16-gemm"
# The default mean context: at CSA ratio 4 the indexer ranks 2048 entries per request.
LONG_CONTEXT = 8192

# Upper bounds on each figure (see docs/optimizations/bf16_gemm.md for the measurements behind them).
BOUNDS: dict[str, float] = {
    # Indexer: admit what a bf16 bmm with bf16-rounded logits does (the accuracy upstream SGLang
    # later accepted), reject what fp8 index queries do.
    "recall_loss_mean": 1e-3,  # 1 - mean top-k recall over all requests and scenarios
    "recall_loss_worst": 4 / 512,  # 1 - recall of the worst request: at most 4 of 512 entries swapped
    "lost_mass_worst": 5e-3,  # fp32-softmax mass of the dropped entries, worst request
    # Pre-mix after Sinkhorn: a few times bf16's input rounding (measured ~1e-3), far below fp8 (~3e-2).
    "premix_rel_pre": 5e-3,
    "premix_rel_post": 5e-3,
    "premix_rel_comb": 5e-3,
    # In the model, attention blocks with the indexer swapped, against the float32 path on the same
    # input: fp32 summation order alone (~1e-7) unless a selection changes; a wrong one moves a
    # block by O(0.1).
    "indexer_block_rel_worst": 1e-2,
}


@dataclass(frozen=True)
class IndexerShape:
    heads: int  # Hi
    dim: int  # Di
    top_k: int
    entries: int  # S, compressed entries of the longest request


@dataclass(frozen=True)
class E2ESettings:
    config: str
    concurrency: int
    context: int
    steps: int
    layers: int | None


def _indexer_shape() -> IndexerShape:
    """The dsv4-flash indexer at a long context: 8192 tokens at compress ratio 4 = 2048 entries."""
    from dsv4opt.workload.config import ModelConfig

    cfg = ModelConfig.from_name("dsv4-flash")
    return IndexerShape(heads=cfg.index_heads, dim=cfg.index_dim, top_k=cfg.index_topk,
                        entries=LONG_CONTEXT // cfg.csa_ratio)


def _e2e_settings(device: torch.device) -> E2ESettings:
    if device.type == "cuda":
        # Six layers hold two CSA (indexer) layers and two HCA layers after the window-only pair.
        return E2ESettings(config="dsv4-flash", concurrency=16, context=8192, steps=4, layers=6)
    return E2ESettings(config="dsv4-tiny", concurrency=8, context=256, steps=4, layers=None)


INDEX_PAGE = 64  # entries per page of the scenarios' key caches (SGLang's block of 64)


def indexer_scenarios(shape: IndexerShape, batch: int, gen: torch.Generator) -> dict[str, dict]:
    """Inputs for the indexer on distributions that stress selection, each [batch] requests long.

    Lengths vary down to fewer entries than top-k. Head weights carry the softmax-style scaling of
    the real indexer (Hi^-0.5 * Di^-0.5), so scores are logit-sized.
    """
    H, D, S = shape.heads, shape.dim, shape.entries
    lengths = torch.linspace(S, max(1, shape.top_k // 2), batch).round().long()

    def randn(*size):
        return torch.randn(*size, generator=gen)

    def pack(q, keys, w, scale_noise=None):
        return _slot_inputs(q, keys, w, lengths, scale_noise)

    w = randn(batch, H) * (H * D) ** -0.5
    out = {"iid": pack(randn(batch, H, D), randn(batch, S, D), w)}
    # Keys around a few centroids: many entries score alike, so the top-k boundary is crowded.
    centroids = randn(batch, 16, D)
    member = torch.randint(0, 16, (batch, S), generator=gen)
    clustered = torch.gather(centroids, 1, member.unsqueeze(-1).expand(-1, -1, D)) + 0.05 * randn(batch, S, D)
    out["clustered"] = pack(randn(batch, H, D), clustered, w)
    # Student-t(2) keys and queries with a few outlier channels: per-entry scales vary widely.
    heavy_k = _student_t(gen, (batch, S, D))
    heavy_q = _student_t(gen, (batch, H, D))
    heavy_k[..., :4] *= 20.0
    heavy_q[..., :4] *= 5.0
    out["heavy_tailed"] = pack(heavy_q, heavy_k, w)
    # Exact near-ties: groups of 8 entries share a key and differ only by a 1e-6..1e-4 relative
    # change of their fp32 scale, far below bf16's resolution but above fp32's.
    base = randn(batch, S // 8, D).repeat_interleave(8, dim=1)
    out["near_ties"] = pack(randn(batch, H, D), base, w,
                            1 + torch.logspace(-6, -4, S).unsqueeze(0) * randn(batch, S).sign())
    return out


def _slot_inputs(q, keys, w, lengths, scale_noise=None) -> dict:
    """The `indexer_logits` slot's arguments for queries q [B, H, D], keys [B, S, D] and head
    weights w [B, H]: e4m3 queries and keys with one fp32 scale each (the query scale folded into
    the weights), keys in a paged cache, one request's pages after another's."""
    from dsv4opt.workload.kvcache import IndexKeyCache, quantize_index_key

    B, H, D = q.shape
    S = keys.shape[1]
    q8, q_scale = quantize_index_key(q.reshape(B * H, D))
    k8, k_scale = quantize_index_key(keys.reshape(B * S, D))
    if scale_noise is not None:
        k_scale = k_scale * scale_noise.reshape(-1)
    pages = -(-S // INDEX_PAGE)
    cache = IndexKeyCache.allocate(D, INDEX_PAGE, B * pages, "cpu")
    entries = (torch.arange(B)[:, None] * pages * INDEX_PAGE + torch.arange(S)[None, :]).reshape(-1)
    cache.write(entries, k8, k_scale)
    page_table = (torch.arange(B)[:, None] * pages + torch.arange(pages)[None, :]).int()
    return {"q8": q8.view(B, H, D), "weights": w * q_scale.view(B, H), "cache": cache,
            "seq_lens": lengths.int(), "page_table": page_table, "max_len": S, "lengths": lengths}


def _to(inp: dict, device: torch.device) -> tuple:
    """The slot's positional arguments on `device`."""
    cache = inp["cache"]
    cache = type(cache)(cache.dim, cache.page_size, cache.data.to(device))
    return (inp["q8"].to(device), inp["weights"].to(device), cache, inp["seq_lens"].to(device),
            inp["page_table"].to(device), inp["max_len"])


def _student_t(gen: torch.Generator, size: tuple[int, ...], df: float = 2.0) -> torch.Tensor:
    """Student-t samples from the seeded generator (torch.distributions ignores generators)."""
    z = torch.randn(*size, generator=gen)
    chi2 = torch.randn(*size, int(df), generator=gen).square().sum(-1)
    return z / torch.sqrt(chi2 / df)


def selection_figures(scores_ref: torch.Tensor, scores_new: torch.Tensor, lengths: torch.Tensor,
                      top_k: int) -> dict[str, torch.Tensor]:
    """Per request: top-k recall, fp32-softmax mass of dropped entries, and the worst swap's gap.

    scores_*: [B, S] fp32 -> each [B] float64. The softmax is over the fp32-selected entries with the
    fp32 scores as logits; the gap is (best dropped - worst admitted) in fp32 score / score std,
    so 0 means only near-ties swapped.
    """
    # -inf marks entries past a request's length; they are never selected (lengths masks them)
    scores_ref = torch.nan_to_num(scores_ref.double().cpu(), neginf=0.0)
    scores_new = torch.nan_to_num(scores_new.double().cpu(), neginf=0.0)
    lengths = lengths.cpu()
    sel_ref = naive.topk_select(scores_ref, lengths, top_k)
    sel_new = naive.topk_select(scores_new, lengths, top_k)
    B, S = scores_ref.shape
    in_ref = torch.zeros(B, S + 1, dtype=torch.bool).scatter_(1, sel_ref.where(sel_ref >= 0, S), True)[:, :S]
    in_new = torch.zeros(B, S + 1, dtype=torch.bool).scatter_(1, sel_new.where(sel_new >= 0, S), True)[:, :S]
    n_ref = in_ref.sum(1).clamp(min=1)
    recall = (in_ref & in_new).sum(1).double() / n_ref
    probs = torch.softmax(scores_ref.masked_fill(~in_ref, float("-inf")), dim=1)
    lost_mass = (probs * (in_ref & ~in_new)).sum(1)
    valid = torch.arange(S).unsqueeze(0) < lengths.unsqueeze(1)
    n_valid = valid.sum(1)
    mean = (scores_ref * valid).sum(1) / n_valid.clamp(min=1)
    var = ((scores_ref - mean[:, None]).square() * valid).sum(1) / (n_valid - 1).clamp(min=1)
    std = torch.where(n_valid > 1, var.sqrt(), torch.ones_like(var)).clamp(min=1e-30)
    dropped_best = scores_ref.masked_fill(~(in_ref & ~in_new), float("-inf")).amax(1)
    admitted_worst = scores_ref.masked_fill(~(in_new & ~in_ref), float("inf")).amin(1)
    gap = torch.where(torch.isfinite(dropped_best), (dropped_best - admitted_worst) / std, torch.zeros(B).double())
    return {"recall": recall, "lost_mass": lost_mass, "swap_gap": gap}


def _premix_inputs(tokens: int, hc: int, hidden: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """RMS-normalised flattened residual copies with outlier channels, a pre-mix weight, Sinkhorn params."""
    x = torch.randn(tokens, hc * hidden, generator=gen)
    x[:, torch.randint(0, hc * hidden, (hc * hidden // 256,), generator=gen)] *= 30.0
    x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    n_mix = 2 * hc + hc * hc
    weight = torch.randn(n_mix, hc * hidden, generator=gen) * (hc * hidden) ** -0.5
    scale = torch.ones(3)
    base = torch.randn(n_mix, generator=gen) * 0.5
    return {"x": x, "weight": weight, "scale": scale, "base": base}


def premix_figures(impl: Callable, device: torch.device, gen: torch.Generator, tokens: int = 64) -> dict[str, float]:
    """Relative error of pre, post, comb after the Sinkhorn split, dsv4-flash widths, `tokens` rows."""
    from dsv4opt.workload.config import ModelConfig

    cfg = ModelConfig.from_name("dsv4-flash")
    inp = _premix_inputs(tokens, cfg.hc, cfg.hidden, gen)
    x, weight = inp["x"].to(device), inp["weight"].to(device)
    from dsv4opt.workload.kernels.naive import hc_split_sinkhorn as split

    args = (inp["scale"], inp["base"], cfg.hc, cfg.hc_sinkhorn_iters, cfg.hc_eps)
    ref = split(naive.hc_premix_ref(x, weight).cpu(), *args)
    new = split(impl(x, weight).float().cpu(), *args)
    return {f"premix_rel_{name}": error_report(n, r).rel
            for name, n, r in zip(("pre", "post", "comb"), new, ref)}


def e2e_figures(settings: E2ESettings, device: torch.device, impls: dict[str, Callable]) -> dict[str, float]:
    """Decode `steps` tokens; every block also runs with one of `impls` swapped in, same input and state.

    One pass per slot, so each figure says what that slot alone changes: `indexer_block_rel_worst`
    (attention blocks with the indexer swapped: only a changed selection moves them) is bounded;
    `premix_block_rel_worst` (every block with the pre-mix swapped) is reported: its bf16 rounding
    reaches the block's FP8 activation quantisation, whose flips move outputs by about 1e-2, so the
    pre-mix is judged by its own figures above.
    """
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.model import DecodeWorkload

    cfg = ModelConfig.from_name(settings.config)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    figures: dict[str, float] = {}
    for slot, name in (("indexer_logits", "indexer"), ("hc_premix", "premix")):
        wl = DecodeWorkload(cfg, concurrency=settings.concurrency, context=settings.context, device=device,
                            layers=settings.layers, seed=0, dtype=dtype)
        rel: list[float] = []
        wl.compare_impls = {slot: impls[slot]}
        watched = "attention_block" if slot == "indexer_logits" else None
        wl.on_block = lambda block, i, out, other: (watched in (None, block)) and rel.append(error_report(other, out).rel)
        gen = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, cfg.vocab, (settings.concurrency,), generator=gen).to(device)
        with torch.no_grad():
            for _ in range(settings.steps):
                tokens = wl.step(tokens).argmax(-1)
        figures[f"{name}_block_rel_worst"] = max(rel)
        figures[f"{name}_block_rel_mean"] = sum(rel) / len(rel)
    return figures


def run_check(device: torch.device, impls: dict[str, Callable], *, batch: int = 8,
              e2e: E2ESettings | None = None) -> CheckResult:
    """Measure `impls` (the two slots) against the float32 path; fail closed on any crossed bound."""
    gen = torch.Generator().manual_seed(0)
    shape = _indexer_shape()
    figures: dict[str, float] = {}
    details: dict[str, dict[str, float]] = {}
    recalls, masses = [], []
    for name, inp in indexer_scenarios(shape, batch, gen).items():
        args = _to(inp, device)
        sel = selection_figures(naive.indexer_logits_fp32(*args), impls["indexer_logits"](*args).float(),
                                inp["lengths"], shape.top_k)
        recalls.append(sel["recall"])
        masses.append(sel["lost_mass"])
        details[name] = {"recall_mean": float(sel["recall"].mean()), "recall_worst": float(sel["recall"].min()),
                         "lost_mass_worst": float(sel["lost_mass"].max()), "swap_gap_worst": float(sel["swap_gap"].max())}
    recall = torch.cat(recalls)
    figures["recall_loss_mean"] = 1.0 - float(recall.mean())
    figures["recall_loss_worst"] = 1.0 - float(recall.min())
    figures["lost_mass_worst"] = float(torch.cat(masses).max())
    figures.update(premix_figures(impls["hc_premix"], device, gen))
    e2e = e2e or _e2e_settings(device)
    missing = ""
    try:
        figures.update(e2e_figures(e2e, device, impls))
    except (ImportError, DsvOptError, RuntimeError) as exc:  # no model run: the gate cannot vouch
        missing = f"end-to-end not measured ({type(exc).__name__}: {exc}); "
    bounds = dict(BOUNDS)
    crossed = [k for k, bound in bounds.items() if not (k in figures and figures[k] <= bound)]
    passed = not crossed and not missing
    shown = ", ".join(f"{k} {figures[k]:.3g}" + (f" > {bounds[k]:.3g}" if k in crossed else "")
                      for k in figures)
    verdict = "passed" if passed else "FAILED (" + ", ".join(crossed) + ")"
    summary = f"bf16-gemm on {device.type}: {verdict}; {missing}{shown}"
    details["e2e"] = vars(e2e)
    return CheckResult(name=NAME, passed=passed, device=str(device), figures=figures, bounds=bounds,
                       summary=summary, details=details)


def check(device: str | None = None) -> CheckResult:
    """The registered gate: this package's implementations on `device` (default: cuda when present)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return run_check(dev, get(NAME).implementations())
