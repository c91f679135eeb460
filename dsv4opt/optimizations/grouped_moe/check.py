"""Correctness gate of grouped-moe: the grouped kernels against the float64 definition of the
routed-experts slot, and the baseline (SGLang's per-slot path) against the same definition.

On a GPU: the model's shapes of both layouts (dp-ep: 32 whole experts and other ranks' slots; tp4:
256 experts of width 512) in bf16, plus the small table. On a CPU: Triton's interpreter in fp16 (it
cannot multiply bf16 in tl.dot) on the small table. Outputs are NaN-poisoned, so a row the kernels
forget (a token whose slots are all on other ranks, a slot dropped from a tile) fails.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from dsv4opt.numerics import error_report, nan_poisoned_allocations
from dsv4opt.optimizations.gate_table import gate_device, table_result
from dsv4opt.optimizations.grouped_moe.cases import MoeCase, gpu_cases, interpreter_cases, make_inputs
from dsv4opt.optimizations.registry import CheckResult

NAME = "grouped-moe"
# bf16 rounding of the activation rows and of the output (2^-9 relative each) and fp32 sums: a few
# 1e-3 in the norm; a slot dropped, doubled or sent to the wrong expert moves a row by O(1).
REL_TOL = 1e-2
_KERNEL_MODULES = ("dsv4opt.workload.kernels.grouped_moe.kernel", "dsv4opt.workload.kernels.moe")


def run_case(case: MoeCase, device: torch.device, dtype: torch.dtype, seed: int = 0, impl=None) -> dict:
    """Errors of grouped-moe (or `impl`) and of the baseline on one case, as plain figures."""
    from dsv4opt.workload.kernels.grouped_moe import grouped_routed_experts
    from dsv4opt.optimizations.grouped_moe.naive import routed_experts
    from dsv4opt.workload.baseline import routed_experts_sm120

    impl = impl or grouped_routed_experts
    x = make_inputs(case, device, dtype, seed)
    ref = routed_experts(x.x.double(), x.local_ids, x.gates.double(), x.w13, x.w2, x.limit, x.scale)  # float64, on device
    with nan_poisoned_allocations():
        out = impl(*x.args())
        base = routed_experts_sm120(*x.args())
    err, base_err = error_report(out, ref), error_report(base, ref)
    return {
        "case": case.name,
        "rel_err": err.rel,
        "max_abs": err.max_abs,
        "worst": list(err.worst_index),
        "nonfinite": err.nonfinite + base_err.nonfinite,
        "baseline_rel_err": base_err.rel,
        "passed": err.ok(REL_TOL) and base_err.ok(REL_TOL),
    }


def check(device: str | None = None, cases: list[MoeCase] | None = None, impl=None) -> CheckResult:
    """Run the table on `device` (default: CUDA if present, else the CPU interpreter)."""
    dev, dtype = gate_device(device, _KERNEL_MODULES)
    cases = cases if cases is not None else (gpu_cases() if dev.type == "cuda" else interpreter_cases())
    rows = [run_case(c, dev, dtype, seed=i, impl=impl) for i, c in enumerate(cases)]
    return table_result(NAME, rows, dev, dtype, REL_TOL, ("rel_err", "baseline_rel_err"),
                        {"table": [asdict(c) for c in cases]})
