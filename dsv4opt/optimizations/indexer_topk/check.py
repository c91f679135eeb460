"""The gate for indexer-topk: does it keep the entries the float64 scores keep, up to ties its
arithmetic cannot resolve?

Per request, against the float64 reference (naive.reference) on the same e4m3 inputs:
- malformed: not exactly min(n, top-k) distinct entries base + s with 0 <= s < n first and -1 after
  (all of base + 0 .. n-1 when n <= top-k), or an unwritten output (outputs poisoned, integers
  included);
- unexplained: the kept set is not the top-k of any scores within `tie_rel * abs_sum` of the
  float64 ones, i.e. min over kept s of (r_s + d_s) < max over the other valid t of (r_t - d_t),
  with r the float64 scores and d_s = tie_rel * scale_s * sum_h |w_h| sum_d |q_hd k_sd|. A correct
  kernel's fp32 score differs from r_s by less than d_s (docs/optimizations/indexer-topk.md: the
  bound), so only such near-ties can swap; a wrong page, a lost scale or a wrong head sum moves
  scores by their own size and swaps entries far from the boundary.
The kernels' scores themselves (kernel.index_scores) are held to the same d_s (`score_err`), and
the recall against the float64 set is reported. The baseline (the path's indexer_logits, then
topk_transform) is judged the same way, for the record.

On a GPU the table is gpu_cases() (dsv4-flash widths, graph width, a 128K context) with FP8
operands; on a CPU, interpreter_cases() under Triton's interpreter (fp16 operands: e4m3 exactly).
Then, in the model (dsv4-tiny on a CPU, dsv4-flash's first 6 layers on a GPU, both at the graph
width), every call of the slot is made again with the candidate and judged against float64 on the
call's own arguments.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Callable

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.numerics import nan_poisoned_allocations
from dsv4opt.optimizations.gate_table import gate_device
from dsv4opt.optimizations.indexer_topk import naive
from dsv4opt.optimizations.indexer_topk.cases import IndexerCase, args, gpu_cases, interpreter_cases, make_inputs
from dsv4opt.optimizations.registry import CheckResult

NAME = "indexer-topk"
# A score is sum_h w_h relu(sum_d q_hd k_sd) * scale_s: exact e4m3 products summed in fp32, D terms
# a head then H heads. Recursive fp32 summation of m terms errs by at most (m - 1) 2^-24 of their
# absolute sum: (128 + 64) 2^-24 < 2^-16 at dsv4-flash widths, with exact (fp16, bf16) operands.
# Hopper's FP8 MMA keeps about 14 bits of its accumulator (DeepSeek-V3 technical report, 3.3.2),
# 4 k-steps of 32 at D = 128: about 4 * 2^-14 = 2^-12 of the terms, bound 2^-11 with room.
TIE_REL = {"exact": 2.0**-16, "fp8": 2.0**-11}
_KERNEL_MODULES = ("dsv4opt.optimizations.indexer_topk.kernel", "dsv4opt.workload.kernels.indexer",
                   "dsv4opt.workload.kernels.indexer_tc")


def judge(indices: torch.Tensor, seq_lens: torch.Tensor, base: torch.Tensor, topk: int, scores: torch.Tensor,
          abs_sum: torch.Tensor, tie_rel: float) -> dict[str, torch.Tensor]:
    """Per request: malformed (bool), unexplained gap (> 0 fails; in units of the request's score
    std) and recall against the float64 top-k. indices: [B, topk]; scores, abs_sum: [B, W] float64
    (scores -inf past seq_lens)."""
    indices, seq_lens, base = indices.long().cpu(), seq_lens.long().cpu(), base.long().cpu()
    scores, abs_sum = scores.double().cpu(), abs_sum.double().cpu()
    B, W = scores.shape
    malformed = torch.zeros(B, dtype=torch.bool)
    gap = torch.zeros(B, dtype=torch.float64)
    recall = torch.ones(B, dtype=torch.float64)
    for b in range(B):
        n, row = int(seq_lens[b]), indices[b]
        keep = min(n, topk)
        s = row[:keep] - base[b]
        if (row[keep:] != -1).any() or ((s < 0) | (s >= n)).any() or s.unique().numel() != keep:
            malformed[b] = True
            gap[b] = float("inf")
            recall[b] = 0.0
            continue
        if n <= topk:  # all of them are kept, whatever they score
            malformed[b] = not torch.equal(s.sort().values, torch.arange(n))
            continue
        r, d = scores[b, :n], tie_rel * abs_sum[b, :n]
        kept = torch.zeros(n, dtype=torch.bool)
        kept[s] = True
        worst_kept = (r + d)[kept].min()
        best_other = (r - d)[~kept].max()
        std = r.std().clamp(min=1e-300)
        gap[b] = max(0.0, float((best_other - worst_kept) / std))
        ref = torch.zeros(n, dtype=torch.bool)
        ref[torch.sort(r, descending=True, stable=True).indices[:topk]] = True
        recall[b] = float((kept & ref).sum()) / topk
    return {"malformed": malformed, "gap": gap, "recall": recall}


def run_case(case: IndexerCase, device: torch.device, tie_rel: float, impl: Callable, baseline: Callable | None,
             seed: int = 0) -> dict:
    """One case's figures: the candidate's selection and scores, and the baseline's selection."""
    from dsv4opt.optimizations.indexer_topk.kernel import index_scores

    inp = make_inputs(case, device, seed)
    _, ref_scores, abs_sum = naive.reference(*args(inp))
    with nan_poisoned_allocations(ints=True):
        out = impl(*args(inp), None)
        base_out = baseline(*args(inp)) if baseline is not None else None
        scores = index_scores(inp["q8"], inp["weights"], inp["cache"], inp["seq_lens"], inp["page_table"])
    got = judge(out, inp["seq_lens"], inp["base"], case.topk, ref_scores, abs_sum, tie_rel)
    W = ref_scores.shape[1]
    scores = scores.double().cpu()
    valid = torch.isfinite(ref_scores)
    diff = (scores[:, :W] - ref_scores).abs().nan_to_num(nan=float("inf"))
    score_err = float((diff / abs_sum.clamp(min=1e-300))[valid].max()) if valid.any() else 0.0
    # a score written past seq_lens: in the reference's columns, or past them in a graph-wide row
    bad_past = bool((torch.isfinite(scores[:, :W]) & ~valid).any() or torch.isfinite(scores[:, W:]).any())
    row = {
        "case": case.name,
        "malformed": int(got["malformed"].sum()),
        "unexplained": int((got["gap"] > 0).sum()),
        "worst_gap": float(got["gap"].max()) if case.batch else 0.0,
        "score_err": float("inf") if bad_past else score_err,
        "recall_min": float(got["recall"].min()) if case.batch else 1.0,
        "recall_mean": float(got["recall"].mean()) if case.batch else 1.0,
        "nonfinite": 0,
    }
    if base_out is not None:
        base = judge(base_out, inp["seq_lens"], inp["base"], case.topk, ref_scores, abs_sum, tie_rel)
        row.update(baseline_malformed=int(base["malformed"].sum()), baseline_unexplained=int((base["gap"] > 0).sum()))
    row["passed"] = row["malformed"] == 0 and row["unexplained"] == 0 and row["score_err"] <= tie_rel
    return row


def model_figures(device: torch.device, tie_rel: float, impl: Callable) -> dict[str, float]:
    """Decode with the baseline slot; every call is made again with `impl` on the same arguments and
    judged against float64 on them (dropped: nothing it does reaches the step). Figures: malformed
    and unexplained requests over every CSA layer and step, and the requests judged."""
    from dsv4opt.workload.baseline import indexer_topk_two_pass
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.model import DecodeWorkload

    if device.type == "cuda":
        cfg, C, context, steps, layers = ModelConfig.from_name("dsv4-flash"), 16, 8192, 2, 6
    else:
        # through the first CSA layer: the interpreter steps the whole model, and one CSA layer is the part
        tiny = ModelConfig.from_name("dsv4-tiny")
        first_csa = next(i for i in range(tiny.layers) if tiny.layer_kind(i) == "csa")
        cfg, C, context, steps, layers = tiny, 4, 64, 1, first_csa + 1
    totals = {"model_malformed": 0.0, "model_unexplained": 0.0, "model_requests": 0.0, "model_ranked": 0.0}

    def slot(q8, weights, cache, seq_lens, page_table, base, topk, logits):
        chosen = indexer_topk_two_pass(q8, weights, cache, seq_lens, page_table, base, topk, logits)
        with nan_poisoned_allocations(ints=True):
            new = impl(q8, weights, cache, seq_lens, page_table, base, topk, logits)
        _, scores, abs_sum = naive.reference(q8, weights, cache, seq_lens, page_table, base, topk)
        got = judge(new, seq_lens, base, topk, scores, abs_sum, tie_rel)
        totals["model_malformed"] += float(got["malformed"].sum())
        totals["model_unexplained"] += float((got["gap"] > 0).sum())
        totals["model_requests"] += len(seq_lens)
        totals["model_ranked"] += float((seq_lens.cpu() > topk).sum())
        return chosen

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    wl = DecodeWorkload(cfg, concurrency=C, context=context, device=device, layers=layers, seed=0, dtype=dtype,
                        impls={"indexer_topk": slot}, graph_context=cfg.max_context)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, cfg.vocab, (C,), generator=gen).to(device)
    with torch.no_grad():
        for _ in range(steps):
            tokens = wl.step(tokens).argmax(-1)
    if not totals["model_ranked"]:
        raise DsvOptError(f"no request had more than top-{cfg.index_topk} indexer entries: the model part is vacuous")
    return totals


def check(device: str | None = None, cases: list[IndexerCase] | None = None, impl: Callable | None = None,
          model: bool = True) -> CheckResult:
    """Run the table (and the model part) on `device` (default: CUDA if present, else the CPU
    interpreter); `impl` replaces the package's slot implementation (tests hand it broken ones)."""
    dev, _ = gate_device(device, _KERNEL_MODULES)
    from dsv4opt.optimizations.indexer_topk.kernel import indexer_topk
    from dsv4opt.workload.baseline import hopper_0523

    impl = impl or indexer_topk
    tie_rel = TIE_REL["fp8" if dev.type == "cuda" else "exact"]
    logits = hopper_0523()["indexer_logits"]

    def baseline(*a):
        return hopper_0523()["indexer_topk"](*a, logits)

    cases = cases if cases is not None else (gpu_cases() if dev.type == "cuda" else interpreter_cases())
    rows = [run_case(c, dev, tie_rel, impl, baseline, seed=i) for i, c in enumerate(cases)]
    figures = {
        "malformed": float(sum(r["malformed"] for r in rows)),
        "unexplained": float(sum(r["unexplained"] for r in rows)),
        "score_err": max(r["score_err"] for r in rows),
        "recall_min": min(r["recall_min"] for r in rows),
        "cases": float(len(rows)),
    }
    bounds = {"malformed": 0.0, "unexplained": 0.0, "score_err": tie_rel}
    missing = ""
    if model:
        bounds.update(model_malformed=0.0, model_unexplained=0.0)
        try:
            figures.update(model_figures(dev, tie_rel, impl))
        except (ImportError, DsvOptError, RuntimeError) as exc:  # no model run: the gate cannot vouch
            missing = f"model part not measured ({type(exc).__name__}: {exc})"
    crossed = [k for k, bound in bounds.items() if not (k in figures and figures[k] <= bound)]
    failed = [r["case"] for r in rows if not r["passed"]]
    passed = not crossed and not missing
    worst = max(rows, key=lambda r: r["score_err"])
    summary = (f"{len(rows) - len(failed)}/{len(rows)} cases keep a top-k of scores within {tie_rel:.1e} of their "
               f"terms' absolute sum on {dev.type}; worst score error {worst['score_err']:.1e} ({worst['case']})"
               + (f"; model: {figures['model_unexplained']:.0f} unexplained, {figures['model_malformed']:.0f} "
                  f"malformed of {figures['model_requests']:.0f} requests" if "model_requests" in figures else "")
               + ("" if passed else "; FAILED: " + ", ".join(filter(None, [missing, *crossed, *failed]))))
    return CheckResult(
        name=NAME, passed=passed,
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter)",
        figures=figures, bounds=bounds, summary=summary,
        details={"tie_rel": tie_rel, "cases": rows, "table": [asdict(c) for c in cases]},
    )
