"""The gate for bf16-gemm: does the model still see the same tokens and compute the same thing?

Numeric error alone does not protect the model: the indexer decides which top-k entries attention
reads. So against the float32 path this measures (bounds and why: docs/optimizations/bf16_gemm.md)
- top-k recall of the indexer on score distributions that make selection hard (near-ties, clustered
  and heavy-tailed keys, long contexts), and the attention mass the dropped entries carried;
- relative error of the hyper-connection pre/post/comb numbers after the Sinkhorn split;
- in the model: a decode run on the float32 path in which every call of the two slots is made
  again with bf16-gemm on the same arguments, and that output is judged and dropped. The model
  never runs the candidate, so nothing compounds over layers and steps (the random-weight model's
  dynamics are chaotic: any perturbation grows into an O(1) change of a whole step, whatever its
  source), and each figure has a bound set by bf16 rounding alone.
Every bounded figure is "bad when large", so one rule applies: pass iff each is <= its bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.numerics import error_report, nan_poisoned_allocations
from dsv4opt.optimizations.bf16_gemm import naive
from dsv4opt.optimizations.registry import CheckResult, get

NAME = "bf16-gemm"
# The default mean context: at CSA ratio 4 the indexer ranks 2048 entries per request.
LONG_CONTEXT = 8192
# Unit roundoff of bf16 (8 significant bits, round to nearest): |bf16(x) - x| <= 2^-8 |x|.
BF16_UNIT_ROUNDOFF = 2.0**-8

# Upper bounds on each figure (docs/optimizations/bf16_gemm.md: the reasoning and measurements behind each).
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
    # In the model, the indexer's selection on the model's own queries and keys: as for the
    # scenarios; a correct kernel differs from the float32 path only in fp32 summation order.
    "model_recall_loss_mean": 1e-3,
}


@dataclass(frozen=True)
class IndexerShape:
    heads: int  # Hi
    dim: int  # Di
    top_k: int
    entries: int  # S, compressed entries of the longest request


@dataclass(frozen=True)
class ModelSettings:
    """The decode run of the model-level part."""

    config: str
    concurrency: int
    context: int  # mean context; requests need more than top-k compressed entries for selection to matter
    steps: int
    layers: int | None


def premix_rounding_bound(hc: int) -> float:
    """Bound on `model_premix_err_worst` that a correct bf16 pre-mix stays under: twice the rms
    error bf16 input rounding can give, sqrt(1 + hc) u (derivation: docs/optimizations/bf16_gemm.md)."""
    return 2.0 * math.sqrt(1 + hc) * BF16_UNIT_ROUNDOFF


def _indexer_shape() -> IndexerShape:
    """The dsv4-flash indexer at a long context: 8192 tokens at compress ratio 4 = 2048 entries."""
    from dsv4opt.workload.config import ModelConfig

    cfg = ModelConfig.from_name("dsv4-flash")
    return IndexerShape(heads=cfg.index_heads, dim=cfg.index_dim, top_k=cfg.index_topk,
                        entries=LONG_CONTEXT // cfg.csa_ratio)


def _model_settings(device: torch.device) -> ModelSettings:
    if device.type == "cuda":
        # Six layers hold two CSA (indexer) layers and two HCA layers after the window-only pair.
        return ModelSettings(config="dsv4-flash", concurrency=16, context=8192, steps=4, layers=6)
    return ModelSettings(config="dsv4-tiny", concurrency=8, context=256, steps=4, layers=None)


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


def premix_error_vs_terms(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> float:
    """||out - x @ weight^T|| / sqrt(sum over outputs o and terms i of (x_i w_oi)^2), in float64.

    The exact product is on the unrounded inputs; the denominator is the size that rounding errors
    of a dot product's terms add up to, so a correct bf16 pre-mix scores a fraction of 2^-8 (about
    0.6 of it) whatever K or the cancellation in the outputs. out: [T, N]; x: [T, K]; weight: [N, K].
    """
    x64, w64 = x.detach().double(), weight.detach().double()
    err = out.detach().double() - x64 @ w64.T
    terms = (x64.square() @ w64.square().T).sum()
    figure = float(torch.linalg.vector_norm(err) / terms.sqrt().clamp(min=1e-300))
    return figure if math.isfinite(figure) else math.inf  # a NaN would vanish in max()


def model_figures(settings: ModelSettings, device: torch.device, impls: dict[str, Callable]) -> tuple[dict[str, float], dict]:
    """Decode on the float32 path; each call of `indexer_logits` and `hc_premix` is made again with
    `impls` on the same arguments (same input, same state), judged against the float32 output and
    dropped. Figures: `model_recall_loss_mean` (1 - mean top-k recall over every request that has
    more than top-k entries, every CSA layer and step) and `model_premix_err_worst`
    (premix_error_vs_terms, worst call). Returns (figures, counts)."""
    from dsv4opt.workload.baseline import IMPLEMENTATIONS as BASELINE
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.model import DecodeWorkload

    cfg = ModelConfig.from_name(settings.config)
    recalls: list[torch.Tensor] = []
    premix_errs: list[float] = []

    def indexer(q8, weights, cache, seq_lens, page_table, max_len):
        ref = BASELINE["indexer_logits"](q8, weights, cache, seq_lens, page_table, max_len)
        with nan_poisoned_allocations():
            new = impls["indexer_logits"](q8, weights, cache, seq_lens, page_table, max_len)
        ref_c, new_c, lengths = ref.cpu(), new.float().cpu(), seq_lens.long().cpu()
        ranked = lengths > cfg.index_topk  # with fewer entries every indexer selects them all
        if ranked.any():
            sel = selection_figures(ref_c[ranked], new_c[ranked], lengths[ranked], cfg.index_topk)
            unwritten = (torch.isfinite(ref_c) & ~torch.isfinite(new_c)).any(1)[ranked]
            recalls.append(sel["recall"].masked_fill(unwritten, 0.0))
        return ref

    def premix(x, weight):
        ref = BASELINE["hc_premix"](x, weight)
        with nan_poisoned_allocations():
            new = impls["hc_premix"](x, weight)
        premix_errs.append(premix_error_vs_terms(new, x, weight))
        return ref

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    wl = DecodeWorkload(cfg, concurrency=settings.concurrency, context=settings.context, device=device,
                        layers=settings.layers, seed=0, dtype=dtype,
                        impls={"indexer_logits": indexer, "hc_premix": premix})
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (settings.concurrency,), generator=gen).to(device)
    with torch.no_grad():
        for _ in range(settings.steps):
            tokens = wl.step(tokens).argmax(-1)
    if not recalls:
        raise DsvOptError(f"no request had more than top-{cfg.index_topk} indexer entries at context "
                          f"{settings.context}: the in-model selection would be vacuous")
    recall = torch.cat(recalls)
    figures = {"model_recall_loss_mean": 1.0 - float(recall.mean()), "model_premix_err_worst": max(premix_errs)}
    counts = {"ranked_requests": len(recall), "premix_calls": len(premix_errs)}
    return figures, counts


def run_check(device: torch.device, impls: dict[str, Callable], *, batch: int = 8,
              model: ModelSettings | None = None) -> CheckResult:
    """Measure `impls` (the two slots) against the float32 path; fail closed on any crossed bound."""
    from dsv4opt.workload.config import ModelConfig

    gen = torch.Generator().manual_seed(0)
    shape = _indexer_shape()
    figures: dict[str, float] = {}
    details: dict[str, dict] = {}
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
    model = model or _model_settings(device)
    bounds = dict(BOUNDS, model_premix_err_worst=premix_rounding_bound(ModelConfig.from_name(model.config).hc))
    details["model"] = vars(model)
    missing = ""
    try:
        model_figs, counts = model_figures(model, device, impls)
        figures.update(model_figs)
        details["model"] = {**vars(model), **counts}
    except (ImportError, DsvOptError, RuntimeError) as exc:  # no model run: the gate cannot vouch
        missing = f"model-level part not measured ({type(exc).__name__}: {exc})"
    crossed = [k for k, bound in bounds.items() if not (k in figures and figures[k] <= bound)]
    passed = not crossed and not missing
    summary = _verdict(figures, bounds, crossed, missing)
    return CheckResult(name=NAME, passed=passed, device=str(device), figures=figures, bounds=bounds,
                       summary=summary, details=details)


def _verdict(figures: dict[str, float], bounds: dict[str, float], crossed: list[str], missing: str) -> str:
    """One line: what crossed its bound, or how close the closest figure came to its own."""
    if not crossed and not missing:
        closest = max(bounds, key=lambda k: figures[k] / bounds[k])
        return (f"passed: all {len(bounds)} bounded figures within their bounds; closest "
                f"{closest} at {figures[closest] / bounds[closest]:.0%} of its bound")
    # figures the missing part would have measured are covered by its reason
    over = [f"{k} {figures[k]:.3g} > {bounds[k]:.3g}" if k in figures else f"{k} not measured"
            for k in crossed if k in figures or not missing]
    return "FAILED: " + "; ".join(filter(None, (missing, ", ".join(over))))


def check(device: str | None = None) -> CheckResult:
    """The registered gate: this package's implementations on `device` (default: cuda when present)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return run_check(dev, get(NAME).implementations())
