"""Correctness gate of mma-attn: the kernel against the float64 reference and the baseline kernel.

On a GPU: the full table in bf16. On a CPU: Triton's interpreter, which cannot multiply bf16 in
tl.dot, so a reduced table in fp16. Outputs are NaN-poisoned so an unwritten element fails.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.numerics import error_report, nan_poisoned_allocations
from dsv4opt.optimizations.mma_attn.cases import AttnCase, gpu_cases, interpreter_cases, make_inputs
from dsv4opt.optimizations.registry import CheckResult

REL_TOL = 1e-2
_KERNEL_MODULES = ("dsv4opt.optimizations.mma_attn.kernel", "dsv4opt.workload.attention.simt",
                   "dsv4opt.workload.kernels.rope")


def _use_interpreter() -> None:
    """Triton decides interpreter or compiler when a kernel is defined, so set it before import (and
    read the environment here: tritonlib.interpreted() would import tritonlib's kernels too early)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    if any(m in sys.modules for m in _KERNEL_MODULES):
        raise DsvOptError(
            "the CPU check runs Triton's interpreter, but the kernels were already loaded without it: "
            "rerun with TRITON_INTERPRET=1 set in the environment"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def run_case(case: AttnCase, device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict:
    """Errors of mma-attn and the baseline on one case, as plain figures."""
    from dsv4opt.optimizations.mma_attn.kernel import mma_attention
    from dsv4opt.workload.attention import sparse_attention_ref, sparse_decode_sm120

    x = make_inputs(case, device, dtype, seed)
    ref_o, ref_lse = sparse_attention_ref(*x.args())
    with nan_poisoned_allocations():
        o, lse = mma_attention(*x.args())
        base_o, base_lse = sparse_decode_sm120(*x.args())
    err_o, err_lse = error_report(o, ref_o), error_report(lse, ref_lse)
    base_err_o = error_report(base_o, ref_o)
    return {
        "case": case.name,
        "rel_err_o": err_o.rel,
        "max_abs_o": err_o.max_abs,
        "worst_o": list(err_o.worst_index),
        "rel_err_lse": err_lse.rel,
        "nonfinite": err_o.nonfinite + err_lse.nonfinite + base_err_o.nonfinite,
        "baseline_rel_err_o": base_err_o.rel,
        "rel_diff_vs_baseline": error_report(o.float(), base_o.float()).rel,
        "passed": err_o.ok(REL_TOL) and err_lse.ok(REL_TOL) and base_err_o.ok(REL_TOL),
    }


def check(device: str | None = None, cases: list[AttnCase] | None = None) -> CheckResult:
    """Run the table on `device` (default: CUDA if present, else the CPU interpreter)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DsvOptError("no CUDA device is visible: run the check with --device cpu (interpreter)")
    if dev.type == "cpu":
        _use_interpreter()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float16
    cases = cases if cases is not None else (gpu_cases() if dev.type == "cuda" else interpreter_cases())
    rows = [run_case(c, dev, dtype, seed=i) for i, c in enumerate(cases)]
    figures = {
        "rel_err_o": max(r["rel_err_o"] for r in rows),
        "rel_err_lse": max(r["rel_err_lse"] for r in rows),
        "baseline_rel_err_o": max(r["baseline_rel_err_o"] for r in rows),
        "nonfinite": float(sum(r["nonfinite"] for r in rows)),
        "cases": float(len(rows)),
    }
    bounds = {"rel_err_o": REL_TOL, "rel_err_lse": REL_TOL, "baseline_rel_err_o": REL_TOL, "nonfinite": 0.0}
    failed = [r["case"] for r in rows if not r["passed"]]
    worst = max(rows, key=lambda r: r["rel_err_o"])
    summary = (
        f"{len(rows) - len(failed)}/{len(rows)} cases within rel {REL_TOL:g} in {str(dtype).removeprefix('torch.')} "
        f"on {dev.type}; worst o rel {worst['rel_err_o']:.2e} ({worst['case']})"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return CheckResult(
        name="mma-attn",
        passed=not failed,
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter)",
        figures=figures,
        bounds=bounds,
        summary=summary,
        details={"dtype": str(dtype), "cases": rows, "table": [asdict(c) for c in cases]},
    )
