"""The toy optimisation's benchmark: its check, then a time on the CPU (the contract every bench.py
follows: dsv4opt/optimizations/timing.py)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from dsv4opt.optimizations.timing import BenchOptions, BenchResult
from tests.optimizations.toy_premix import check, toy_premix


@dataclass
class Result(BenchResult):
    us: float = 0.0

    def as_json(self) -> dict:
        return {"bench": "toy-premix", "check": asdict(self.check), "us": self.us}


def run_bench(options: BenchOptions = BenchOptions()) -> Result:
    result = Result(check=check("cpu"), device="cpu")
    if result.check.passed:
        x, w = torch.randn(max(options.batches or (8,)), 256), torch.randn(24, 256)
        t0 = time.perf_counter()
        toy_premix(x, w)
        result.us = (time.perf_counter() - t0) * 1e6
    return result


def render(result: Result) -> str:
    return f"toy-premix: {result.check.summary}; {result.us:.0f} us"
