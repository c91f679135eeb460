"""The gate for fuse-glue: does each fused region compute what SGLang's eager glue computes?

- Per region (the glue slots, the per-slot MoE path's three pieces, and the routed-experts slot
  they make up), over a table of awkward shapes (one row, widths off the block size, several column
  blocks, -1 expert slots, every slot on another rank, other ranks' slots holding garbage) and, on
  a GPU, dsv4-flash's shapes: the fused code against the float64 definition
  (dsv4opt/workload/kernels/naive.py) with every output NaN-poisoned (integer and bool outputs
  with bytes no valid value has), and SGLang's eager operations against the same definition, so
  the definition is shown to be what SGLang's operations compute.
- In the model, block by block: each attention and MoE block run with fuse-glue's slots and with
  the baseline's on the same input and state, over decode steps (DecodeWorkload.compare_impls).
Every figure is "bad when large"; pass iff each is within its bound.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.numerics import INT_POISON, error_report, nan_poisoned_allocations
from dsv4opt.optimizations.fuse_glue.cases import REGIONS, SLOTS, GlueCase, gpu_cases, interpreter_cases, make_args
from dsv4opt.optimizations.registry import CheckResult, get
from dsv4opt.tritonlib import interpreted

NAME = "fuse-glue"
# Relative error of an output in the activation dtype: a few roundings of that dtype.
REL_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
FP32_OUT_TOL = 1e-4  # post and comb, fp32 whatever the activations: 20 Sinkhorn iterations' rounding
# In the model the fused and eager regions round differently in the last bit; through the next
# FP8 activation quantisation that moves a block by about 1e-2 at most. A wrong region (a lost
# scale, a slot of another rank let through) moves it by O(0.1) or more.
BLOCK_TOL = 5e-2
LAYOUTS = ("tp4", "dp-ep")  # the model-level part runs in both: the MoE's glue differs between them


@dataclass(frozen=True)
class ModelSettings:
    config: str
    concurrency: int
    context: int
    steps: int
    layers: int | None


def model_settings(device: torch.device) -> ModelSettings:
    if device.type == "cuda":
        # Four layers: the two window-only ones, a CSA and an HCA layer; hash routing in all four.
        return ModelSettings("dsv4-flash", concurrency=16, context=8192, steps=2, layers=4)
    # Under the interpreter one layer (two blocks) already takes seconds a step. Four layers hold
    # hash-routed and scored MoE layers; every region runs in every layer.
    if interpreted():
        return ModelSettings("dsv4-tiny", concurrency=2, context=40, steps=1, layers=1)
    return ModelSettings("dsv4-tiny", concurrency=2, context=40, steps=1, layers=4)


def _float64(args: tuple) -> tuple:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            out.append(a.double())
        elif isinstance(a, torch.dtype):
            out.append(torch.float64)
        else:
            out.append(a)
    return tuple(out)


def _outputs(impl: Callable, args: tuple) -> tuple:
    out = impl(*args)
    return tuple(out) if isinstance(out, tuple) else (out,)


def region_impls(impls: dict[str, Callable]) -> dict[str, Callable]:
    """The fused code of every region: the slots from `impls`, the per-slot path's pieces from the kernels."""
    from dsv4opt.optimizations.fuse_glue import kernel

    return {**{r: impls[r] for r in SLOTS}, "moe_slots": kernel.moe_slots, "moe_act": kernel.silu_mul_clamp,
            "moe_combine": kernel.moe_combine}


# Outputs that are fp32 whatever the activations (hc_split_sum's post and comb), by position; the
# regions with floating outputs at all (moe_local's and moe_slots' are indices and a mask, compared exactly).
FP32_OUTPUTS = {"hc_split_sum": (1, 2)}
FLOAT_OUTPUTS = ("hc_split_sum", "moe_act", "moe_combine", "routed_experts")


def _compare(region: str, outs: tuple, refs: tuple) -> dict:
    """Worst relative error of the floating outputs (activation dtype; fp32 side outputs apart),
    mismatches of the others, an unwritten bool counting as one."""
    rel, rel_fp32, nonfinite, mismatches = 0.0, 0.0, 0, 0
    for i, (out, ref) in enumerate(zip(outs, refs)):
        if ref.is_floating_point():
            report = error_report(out, ref)
            if i in FP32_OUTPUTS.get(region, ()):
                rel_fp32 = max(rel_fp32, report.rel)
            else:
                rel = max(rel, report.rel)
            nonfinite += report.nonfinite
        else:
            if out.dtype == torch.bool:
                mismatches += int((out.contiguous().view(torch.uint8) == INT_POISON).sum())
            mismatches += int((out.cpu().to(ref.dtype) != ref.cpu()).sum())
    return {"rel": rel, "rel_fp32": rel_fp32, "nonfinite": nonfinite, "mismatches": mismatches}


def run_case(case: GlueCase, impl: Callable, device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict:
    """The fused and the eager region on one case, each against the float64 definition."""
    from dsv4opt.optimizations.fuse_glue.naive import EAGER, REFERENCES

    args = make_args(case, device, dtype, torch.Generator().manual_seed(seed))
    refs = _outputs(REFERENCES[case.region], _float64(args))
    tol = REL_TOL[dtype]
    with nan_poisoned_allocations(ints=True):
        fused = _compare(case.region, _outputs(impl, args), refs)
    eager = _compare(case.region, _outputs(EAGER[case.region], args), refs)
    ok = lambda r: r["rel"] <= tol and r["rel_fp32"] <= FP32_OUT_TOL and not r["nonfinite"] and not r["mismatches"]
    return {
        "case": case.id, "rel_err": fused["rel"], "rel_err_fp32": fused["rel_fp32"], "nonfinite": fused["nonfinite"],
        "mismatches": fused["mismatches"], "eager_rel_err": eager["rel"], "eager_rel_err_fp32": eager["rel_fp32"],
        "eager_mismatches": eager["mismatches"], "passed": ok(fused) and ok(eager),
    }


def block_figures(settings: ModelSettings, device: torch.device, impls: dict[str, Callable]) -> dict[str, float]:
    """Decode `steps` tokens in each layout (the local-expert map and other ranks' slots run under
    dp-ep only); every block also runs with `impls` on the same input and state."""
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.model import DecodeWorkload

    cfg = ModelConfig.from_name(settings.config)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    reports = []
    for layout in LAYOUTS:
        wl = DecodeWorkload(cfg, concurrency=settings.concurrency, context=settings.context, device=device,
                            layers=settings.layers, seed=0, dtype=dtype, layout=layout)
        wl.compare_impls = dict(impls)
        wl.on_block = lambda block, i, out, other: reports.append(error_report(other, out))
        tokens = torch.randint(0, cfg.vocab, (settings.concurrency,), generator=torch.Generator().manual_seed(1))
        tokens = tokens.to(device)
        with torch.no_grad():
            for _ in range(settings.steps):
                tokens = wl.step(tokens).argmax(-1)
    return {"block_rel_worst": max(r.rel for r in reports), "block_rel_mean": sum(r.rel for r in reports) / len(reports),
            "block_nonfinite": float(sum(r.nonfinite for r in reports)), "blocks": float(len(reports))}


def run_check(device: torch.device, impls: dict[str, Callable], cases: list[GlueCase] | None = None,
              model: ModelSettings | None = None) -> CheckResult:
    """Measure `impls` (fuse-glue's slots) against the float64 definitions, region by region, and in the model."""
    missing = [s for s in SLOTS if s not in impls]
    if missing:
        raise DsvOptError(f"fuse-glue's gate needs an implementation of each of its slots; missing: {', '.join(missing)}")
    fused = region_impls(impls)
    if device.type == "cuda":
        dtype = torch.bfloat16
    else:
        dtype = torch.float16 if interpreted() else torch.float32  # the interpreter cannot multiply bf16
    cases = cases if cases is not None else (gpu_cases() if device.type == "cuda" else interpreter_cases())
    rows = [run_case(c, fused[c.region], device, dtype, seed=i) for i, c in enumerate(cases)]
    figures: dict[str, float] = {}
    for region in REGIONS:
        mine = [r for r in rows if r["case"].startswith(region + ":")]
        if mine and region in FLOAT_OUTPUTS:
            figures[f"{region}_rel_worst"] = max(r["rel_err"] for r in mine)
        if mine and region in FP32_OUTPUTS:
            figures[f"{region}_fp32_rel_worst"] = max(r["rel_err_fp32"] for r in mine)
    figures["nonfinite"] = float(sum(r["nonfinite"] for r in rows))
    figures["int_mismatches"] = float(sum(r["mismatches"] for r in rows))
    figures["eager_rel_worst"] = max(r["eager_rel_err"] for r in rows)
    figures["eager_fp32_rel_worst"] = max(r["eager_rel_err_fp32"] for r in rows)
    figures["eager_int_mismatches"] = float(sum(r["eager_mismatches"] for r in rows))
    model = model or model_settings(device)
    figures.update(block_figures(model, device, impls))
    tol = REL_TOL[dtype]
    bounds = {f"{r}_rel_worst": tol for r in REGIONS if f"{r}_rel_worst" in figures}
    bounds.update({f"{s}_fp32_rel_worst": FP32_OUT_TOL for s in FP32_OUTPUTS if f"{s}_fp32_rel_worst" in figures})
    bounds.update({"nonfinite": 0.0, "int_mismatches": 0.0, "eager_rel_worst": tol, "eager_fp32_rel_worst": FP32_OUT_TOL,
                   "eager_int_mismatches": 0.0,
                   "block_rel_worst": BLOCK_TOL, "block_nonfinite": 0.0})
    crossed = [k for k, bound in bounds.items() if not figures[k] <= bound]
    failed = [r["case"] for r in rows if not r["passed"]]
    passed = not crossed and not failed
    where = _device_label(device)
    summary = (f"{len(rows) - len(failed)}/{len(rows)} region cases within rel {tol:g} in "
               f"{str(dtype).removeprefix('torch.')} on {where}; in the model {int(figures['blocks'])} blocks, "
               f"worst rel {figures['block_rel_worst']:.2e} (bound {BLOCK_TOL:g})"
               + (f"; FAILED: {', '.join(crossed + failed)}" if not passed else ""))
    return CheckResult(name=NAME, passed=passed, device=where, figures=figures, bounds=bounds, summary=summary,
                       details={"dtype": str(dtype), "cases": rows, "model": asdict(model)})


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if interpreted():
        return "cpu (Triton interpreter)"
    return "cpu (plain-torch path; the Triton kernels are checked on a GPU or with TRITON_INTERPRET=1)"


def check(device: str | None = None) -> CheckResult:
    """The registered gate: this package's implementations on `device` (default: cuda when present)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DsvOptError("no CUDA device is visible: run the check with --device cpu")
    return run_check(dev, get(NAME).implementations())
