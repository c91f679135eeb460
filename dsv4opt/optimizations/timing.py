"""What the optimisations' benchmarks share: the contract `dsv4opt bench NAME` calls them by
(`run_bench(options: BenchOptions) -> BenchResult`, then `render(result)` and `result.as_json()`),
CUDA-graph medians, the copy-bandwidth ceiling and the number of rotating input sets that keeps a
timed call's inputs out of L2."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from dsv4opt.optimizations.registry import CheckResult


def _quiet(_msg: str) -> None:
    return None


@dataclass(frozen=True)
class BenchOptions:
    """What `dsv4opt bench NAME` hands every benchmark's `run_bench`; a benchmark reads what applies
    to it (only mma-attn reads a KV cache) and takes its own extras as keyword arguments."""

    batches: tuple[int, ...] | None = None  # batch sizes or concurrencies; None: the benchmark's own
    kv: str = "fp8"  # the KV cache layout read: fp8 (SGLang's) or bf16
    on_step: Callable[[str], None] = _quiet  # progress, one short line a step


@dataclass
class BenchResult:
    """What every benchmark returns: its correctness check (run first: nothing is timed when it
    fails), the device and the copy-bandwidth ceiling. Each benchmark adds its rows and its JSON."""

    check: CheckResult
    device: str
    copy_gbps: float = 0.0

    def check_json(self) -> dict:
        """The check as JSON, its details cut to the cases."""
        check = asdict(self.check)
        check["details"] = {"cases": check["details"].get("cases", [])}
        return check

    def as_json(self) -> dict:
        raise NotImplementedError

# Bytes the input sets of one rotation read together, in multiples of the L2's size.
L2_SPAN = 3
MAX_SETS = 256


def median_graph_ms(fn: Callable[[], object]) -> float:
    """Median milliseconds per call of fn, replayed as a CUDA graph (triton.testing.do_bench_cudagraph)."""
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))


def copy_bandwidth_gbps(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    torch.cuda.synchronize()  # the timing runs on a stream of its own
    import triton.testing

    # Captured in a graph the copy runs on the copy engines, eagerly as a kernel: the faster of
    # the two is the ceiling (the conservative choice for a fraction of it).
    ms = min(median_graph_ms(lambda: dst.copy_(src)), float(triton.testing.do_bench(lambda: dst.copy_(src), rep=200, return_mode="median")))
    return 2 * nbytes / (ms * 1e-3) / 1e9


def sets_needed(per_call_bytes: int, l2_bytes: int) -> int:
    """How many input sets a rotation needs so that together they read L2_SPAN L2s."""
    return min(MAX_SETS, max(2, math.ceil(L2_SPAN * l2_bytes / max(1, per_call_bytes))))
