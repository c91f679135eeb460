"""What the table-driven correctness gates share: choosing Triton's interpreter on a CPU, turning
per-case rows into a CheckResult, and the table a benchmark prints when its check failed."""

from __future__ import annotations

import os
import sys
from typing import Sequence

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.optimizations.registry import CheckResult


def use_interpreter(kernel_modules: Sequence[str]) -> None:
    """Triton decides interpreter or compiler when a kernel is defined, so set it before import.
    (Read from the environment here, not through dsv4opt.tritonlib, whose import defines kernels:
    every kernel module imports it, so it counts with the gate's own.)"""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    if any(m in sys.modules for m in ("dsv4opt.tritonlib", *kernel_modules)):
        raise DsvOptError(
            "the CPU check runs Triton's interpreter, but the kernels were already loaded without it: "
            "rerun with TRITON_INTERPRET=1 set in the environment"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def gate_device(device: str | None, kernel_modules: Sequence[str]) -> tuple[torch.device, torch.dtype]:
    """The device a gate runs on (default: CUDA if present, else the CPU interpreter) and its dtype:
    bf16 on a GPU, fp16 under the interpreter (it cannot multiply bf16 in tl.dot)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DsvOptError("no CUDA device is visible: run the check with --device cpu (interpreter)")
    if dev.type == "cpu":
        use_interpreter(kernel_modules)
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float16)


def table_result(name: str, rows: list[dict], dev: torch.device, dtype: torch.dtype, tol: float,
                 errors: Sequence[str], details: dict, notes: Sequence[str] = ()) -> CheckResult:
    """A gate's verdict from its rows (each with "case", "passed", "nonfinite" and the `errors`
    keys; the first error key names the worst case): each error's worst over the table, bounded by
    `tol`, and no non-finite output."""
    figures = {key: max(r[key] for r in rows) for key in errors}
    figures.update(nonfinite=float(sum(r["nonfinite"] for r in rows)), cases=float(len(rows)))
    bounds = {**{key: tol for key in errors}, "nonfinite": 0.0}
    failed = [r["case"] for r in rows if not r["passed"]]
    worst = max(rows, key=lambda r: r[errors[0]])
    summary = (
        f"{len(rows) - len(failed)}/{len(rows)} cases within rel {tol:g} in {str(dtype).removeprefix('torch.')} "
        f"on {dev.type}; worst {errors[0].replace('_', ' ')} {worst[errors[0]]:.2e} ({worst['case']})"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return CheckResult(
        name=name,
        passed=not failed,
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter)",
        figures=figures,
        bounds=bounds,
        summary=summary,
        details={"dtype": str(dtype), "cases": rows, **details},
        notes=tuple(notes),
    )


def failed_table(name: str, check: CheckResult, columns: Sequence[str]):
    """The rich table a benchmark prints instead of timings when its check failed: the failed cases."""
    from rich.table import Table

    table = Table(title=f"{name} check FAILED on {check.device}: no timing, no speed-up")
    table.add_column("case")
    for col in columns:
        table.add_column(col.replace("_", " "), justify="right")
    for c in check.details["cases"]:
        if not c["passed"]:
            table.add_row(c["case"], *(f"{c[col]:.2e}" for col in columns))
    return table
