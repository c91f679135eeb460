"""A fourth, trivial optimisation, registered at runtime by a test: the pre-mix computed in float64.

It exists to show that an optimisation is one package: nothing outside this folder names it.
"""

from __future__ import annotations

import torch

from dsv4opt.numerics import error_report
from dsv4opt.optimizations.registry import CheckResult

NAME = "toy-premix"
BROKEN = False  # a test sets it to show the gate failing


def toy_premix(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The `hc_premix` slot in float64, rounded to fp32."""
    out = (x.double() @ weight.double().t()).float()
    return out * 1.5 if BROKEN else out


IMPLEMENTATIONS = {"hc_premix": toy_premix}


def check(device: str | None = None) -> CheckResult:
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 256, generator=gen), torch.randn(24, 256, generator=gen)
    err = error_report(toy_premix(x, w), x.double() @ w.double().t())
    bound = 1e-6
    return CheckResult(name=NAME, passed=err.ok(bound), device=device or "cpu", figures={"rel": err.rel},
                       bounds={"rel": bound}, summary=f"toy-premix rel {err.rel:.1e} (bound {bound:g})")
