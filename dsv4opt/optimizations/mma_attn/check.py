"""Correctness gate of mma-attn: the kernel against the float64 reference and the baseline kernel.

On a GPU: the full table in bf16. On a CPU: Triton's interpreter, which cannot multiply bf16 in
tl.dot, so a reduced table in fp16. Outputs are NaN-poisoned so an unwritten element fails.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

import torch

from dsv4opt.numerics import error_report, nan_poisoned_allocations
from dsv4opt.optimizations.gate_table import gate_device, table_result
from dsv4opt.optimizations.mma_attn.cases import AttnCase, gpu_cases, interpreter_cases, make_inputs
from dsv4opt.optimizations.registry import CheckResult

REL_TOL = 1e-2
_KERNEL_MODULES = ("dsv4opt.optimizations.mma_attn.kernel", "dsv4opt.workload.attention.simt",
                   "dsv4opt.workload.kernels.rope")


def run_case(case: AttnCase, device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict:
    """Errors of mma-attn and the baseline on one case, as plain figures."""
    from dsv4opt.optimizations.mma_attn.kernel import fitting_plan, mma_attention
    from dsv4opt.workload.attention import sparse_attention_ref, sparse_decode_sm120

    x = make_inputs(case, device, dtype, seed)
    engine = fitting_plan(*x.args()).engine
    ref_o, ref_lse = sparse_attention_ref(*x.args())
    with nan_poisoned_allocations():
        o, lse = mma_attention(*x.args())
        base_o, base_lse = sparse_decode_sm120(*x.args())
    err_o, err_lse = error_report(o, ref_o), error_report(lse, ref_lse)
    base_err_o = error_report(base_o, ref_o)
    return {
        "case": case.name,
        "engine": engine,
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
    dev, dtype = gate_device(device, _KERNEL_MODULES)
    cases = cases if cases is not None else (gpu_cases() if dev.type == "cuda" else interpreter_cases())
    rows = [run_case(c, dev, dtype, seed=i) for i, c in enumerate(cases)]
    return table_result("mma-attn", rows, dev, dtype, REL_TOL, ("rel_err_o", "rel_err_lse", "baseline_rel_err_o"),
                        {"table": [asdict(c) for c in cases]}, engine_notes(rows))


# kernel.plan's engines in words
ENGINE_NAMES = {
    "triton": "block-level",
    "triton-chunked": "block-level, chunked (less shared memory than Hopper)",
    "gluon": "bf16 Gluon per cache",
    "gluon-ws": "bf16 warp-specialised",
    "gluon-fp8": "FP8 Gluon",
    "gluon-fp8-ws": "FP8 warp-specialised",
}


def engine_notes(rows: list[dict]) -> list[str]:
    """Which main loops the table ran (cases each), and why the Gluon loops did not, where they did not."""
    from dsv4opt.optimizations.mma_attn.dispatch import gluon_unavailable_reason

    counts = Counter(ENGINE_NAMES.get(r["engine"], r["engine"]) for r in rows)
    notes = ["main loops: " + ", ".join(f"{name} {n}" for name, n in counts.most_common())]
    reason = gluon_unavailable_reason()
    if reason:
        notes.append(f"Gluon loops off here: {reason}; the block-level kernel runs instead")
    return notes
