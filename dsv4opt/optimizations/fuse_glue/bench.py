"""`dsv4opt bench fuse-glue`: each fused region against its eager baseline at dsv4-flash's shapes.

Runs the gate first; when it fails nothing is timed and no speed-up is printed. Per region and
concurrency C: the eager glue (SGLang's operations: the baseline slot) and the fused kernel, each
the median of CUDA-graph replays in which consecutive calls cycle through enough independent
input sets that what a call reads has left L2 by the time its set comes round again; the bytes
the fused kernel must move and their floor at the copy bandwidth measured in the same run. Per C,
the whole glue of one layer (the pre-mix split twice, the local-expert map and the per-slot
path's three pieces once) eager against fused: the kernel speed-up `recommend` takes from
measured.json, and the saving per layer to hold against what a profile's regions predicted.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.optimizations.fuse_glue.cases import FLASH, GlueCase, flash_cases, make_args
from dsv4opt.optimizations import timing
from dsv4opt.optimizations.timing import BenchOptions, copy_bandwidth_gbps, median_graph_ms, sets_needed

BATCHES = (1, 32, 64)
# Calls of each region a layer (the routed experts' GEMVs are not glue and not timed here).
PER_LAYER = {"hc_split_sum": 2, "moe_local": 1, "moe_slots": 1, "moe_act": 1, "moe_combine": 1}


@dataclass(frozen=True)
class BenchRow:
    region: str
    concurrency: int
    eager_us: float
    fused_us: float
    bytes_moved: int  # what the fused kernel reads and writes once
    floor_us: float  # bytes_moved at the copy bandwidth of this run
    input_sets: int

    @property
    def speedup(self) -> float:
        return self.eager_us / self.fused_us


@dataclass
class BenchResult(timing.BenchResult):
    rows: list[BenchRow] = field(default_factory=list)

    def per_layer(self) -> dict[int, dict[str, float]]:
        """Per C: one layer's glue, eager and fused (microseconds), its saving and speed-up."""
        out: dict[int, dict[str, float]] = {}
        for r in self.rows:
            c = out.setdefault(r.concurrency, {"eager_us": 0.0, "fused_us": 0.0})
            c["eager_us"] += PER_LAYER[r.region] * r.eager_us
            c["fused_us"] += PER_LAYER[r.region] * r.fused_us
        for c in out.values():
            c["saving_us"] = c["eager_us"] - c["fused_us"]
            c["speedup"] = c["eager_us"] / c["fused_us"]
        return out

    def as_json(self) -> dict:
        check = self.check_json()
        per_layer = self.per_layer()
        return {
            "bench": "fuse-glue",
            "device": self.device,
            "copy_gbps": self.copy_gbps,
            "check": check,
            "rows": [{**asdict(r), "speedup": r.speedup} for r in self.rows],
            "per_layer": {str(c): v for c, v in per_layer.items()},
            # what scripts/record_measured.py copies into measured.json
            "kernel_speedup": {str(c): v["speedup"] for c, v in per_layer.items()},
        }


def fused_bytes(case: GlueCase, args: tuple) -> int:
    """Bytes the fused kernel of `case` reads and writes once: its inputs and outputs (the combine
    reads only the slots of this rank's experts)."""
    if case.region == "hc_split_sum":
        mix, rsqrt, flat = args[:3]
        T, d, e = flat.shape[0], flat.shape[1] // case.hc, args[-1].itemsize
        return mix.nbytes + rsqrt.nbytes + flat.nbytes + T * d * e + 4 * T * (case.hc + case.hc * case.hc)
    if case.region == "moe_local":
        ids, owner, row_rank = args
        return ids.nbytes + row_rank.nbytes + 4 * ids.numel() + ids.numel() * owner.element_size()  # entries read, out
    if case.region == "moe_slots":
        (local,) = args
        return local.nbytes + (4 + 4 + 1 + 4) * local.numel()
    if case.region == "moe_act":
        inter = args[0]
        return inter.nbytes + inter.nbytes // 2
    down, invalid, gates, _ = args
    M, d = gates.shape[0], down.shape[1]
    kept = int((~invalid).sum())
    return kept * d * down.element_size() + invalid.nbytes + gates.nbytes + M * d * down.element_size()


def rotating(fn: Callable, sets: list[tuple]) -> Callable[[], object]:
    """A call of fn on the next input set each time; a graph captured over many calls keeps the
    order, so its replays cycle through the sets too."""
    cycle = itertools.cycle(sets)
    return lambda: fn(*next(cycle))


def run_bench(options: BenchOptions = BenchOptions()) -> BenchResult:
    """Check, then time each glue region eager and fused at each concurrency (options.batches)."""
    if not torch.cuda.is_available():
        raise DsvOptError("dsv4opt bench fuse-glue needs a CUDA GPU (on a CPU only the correctness check runs: "
                          "dsv4opt list --check)")
    from dsv4opt.optimizations.fuse_glue.check import check, region_impls
    from dsv4opt.optimizations.fuse_glue.kernel import IMPLEMENTATIONS
    from dsv4opt.optimizations.fuse_glue.naive import EAGER

    batches, on_step = options.batches or BATCHES, options.on_step
    on_step("correctness check")
    result = BenchResult(check=check("cuda"), device=torch.cuda.get_device_name())
    if not result.check.passed:
        return result
    on_step("copy bandwidth")
    result.copy_gbps = copy_bandwidth_gbps()
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    for c in batches:
        for case in flash_cases(c):
            on_step(f"C = {c}: {case.region}")
            first = make_args(case, "cuda", torch.bfloat16, torch.Generator().manual_seed(0))
            moved = fused_bytes(case, first)
            n = sets_needed(moved, l2_bytes)
            sets = [first] + [make_args(case, "cuda", torch.bfloat16, torch.Generator().manual_seed(i))
                              for i in range(1, n)]
            torch.cuda.synchronize()  # do_bench_cudagraph runs on a stream of its own
            eager_ms = median_graph_ms(rotating(EAGER[case.region], sets))
            fused_ms = median_graph_ms(rotating(region_impls(IMPLEMENTATIONS)[case.region], sets))
            result.rows.append(BenchRow(region=case.region, concurrency=c, eager_us=eager_ms * 1e3, fused_us=fused_ms * 1e3,
                                        bytes_moved=moved, floor_us=moved / (result.copy_gbps * 1e3), input_sets=n))
            del sets, first
    return result


def render(result: BenchResult):
    """The rows as a table whose names stay whole at 80 columns, the per-layer sums and the check
    under it (or the failed check)."""
    from rich.console import Group
    from rich.text import Text

    from dsv4opt.display import narrow_table

    if not result.check.passed:
        from dsv4opt.optimizations.gate_table import failed_table

        return failed_table("fuse-glue", result.check, ("rel_err", "mismatches", "eager_rel_err"))
    table = narrow_table(f"fuse-glue on {result.device} (dsv4-flash, {FLASH.layers} layers; copy {result.copy_gbps:.0f} GB/s)")
    for col in ("C", "region", "eager µs", "fused µs", "x eager", "bytes", "floor µs", "sets"):
        table.add_column(col, justify="left" if col == "region" else "right", no_wrap=True)
    for r in result.rows:
        table.add_row(str(r.concurrency), r.region, f"{r.eager_us:.2f}", f"{r.fused_us:.2f}", f"{r.speedup:.1f}",
                      f"{r.bytes_moved / 1e6:.2f} MB", f"{r.floor_us:.2f}", str(r.input_sets))
    sums = [f"C = {c}: one layer {v['eager_us']:.2f} -> {v['fused_us']:.2f} µs ({v['speedup']:.1f}x), saves "
            f"{v['saving_us']:.1f} µs, x{FLASH.layers}: {v['saving_us'] * FLASH.layers / 1e3:.2f} ms a step"
            for c, v in result.per_layer().items()]
    return Group(table, *(Text(line) for line in sums), Text(f"check: {result.check.summary}"))
