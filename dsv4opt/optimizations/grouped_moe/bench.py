"""`dsv4opt bench grouped-moe`: the grouped routed experts against the weight-bytes floor and
SGLang's per-slot path, at the model's shapes on one of its 8 EP ranks.

Runs the correctness gate first; when it fails, nothing is timed and no speed-up is printed. At
concurrency C the MoE sees the 8C gathered tokens of all DP ranks: C of them this rank's, whose six
slots route to local experts as in the embedded model (`e mod R` of a random top-6), the rest all
on other ranks' experts (-1). Times are medians of CUDA-graph replays; calls cycle through
independent token sets (the weights, 0.5 GB a layer, are far above L2 anyway).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.optimizations.registry import CheckResult
from dsv4opt.workload.config import ModelConfig

_CFG = ModelConfig.from_name("dsv4-flash")
CONCURRENCIES = (1, 16, 32, 64)
SETS = 4


@dataclass(frozen=True)
class BenchRow:
    concurrency: int
    tokens: int  # gathered tokens M = ranks * C
    experts_hit: int  # local experts with at least one slot
    grouped_us: float
    baseline_us: float  # SGLang's per-slot path: two CUDA-core GEMVs per slot + eager glue
    bytes_moved: int  # weights of the experts hit + tokens in and out
    floor_us: float  # bytes_moved over the copy bandwidth measured in this run
    frac_floor: float
    speedup_vs_baseline: float


@dataclass
class BenchResult:
    check: CheckResult
    device: str
    copy_gbps: float = 0.0
    rows: list[BenchRow] = field(default_factory=list)

    def as_json(self) -> dict:
        check = asdict(self.check)
        check["details"] = {"cases": check["details"].get("cases", [])}
        shape = {"hidden": _CFG.hidden, "width": _CFG.expert_width, "experts_per_rank": _CFG.experts // _CFG.expert_parallel,
                 "topk": _CFG.experts_per_token, "ranks": _CFG.expert_parallel}
        return {"bench": "grouped-moe", "device": self.device, "shape": shape, "copy_gbps": self.copy_gbps,
                "check": check, "rows": [asdict(r) for r in self.rows]}


def routing(concurrency: int, experts: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(local_ids, gates) of the 8C gathered tokens: the first C this rank's, the rest other ranks'."""
    ranks, k = _CFG.expert_parallel, _CFG.experts_per_token
    M = ranks * concurrency
    ids = torch.full((M, k), -1, dtype=torch.int32)
    picks = torch.stack([torch.randperm(_CFG.experts, generator=gen)[:k] for _ in range(concurrency)])
    ids[:concurrency] = (picks % experts).to(torch.int32)
    gates = torch.rand(M, k, generator=gen)
    return ids.cuda(), (gates / gates.sum(-1, keepdim=True)).cuda()


def run_bench(concurrencies: Sequence[int] = CONCURRENCIES, on_step: Callable[[str], None] = lambda _msg: None,
              batches: Sequence[int] | None = None) -> BenchResult:
    """Check, then time the grouped kernels and the baseline for each concurrency (`--batch` = C)."""
    if not torch.cuda.is_available():
        raise DsvOptError("dsv4opt bench grouped-moe needs a CUDA GPU (on a CPU only the correctness check runs, under Triton's interpreter)")
    from dsv4opt.optimizations.grouped_moe.check import check
    from dsv4opt.optimizations.grouped_moe.kernel import grouped_routed_experts
    from dsv4opt.optimizations.mma_attn.bench import _median_graph_ms, copy_bandwidth_gbps
    from dsv4opt.workload.baseline import routed_experts_sm120
    from dsv4opt.workload.weights import Mxfp4Experts

    concurrencies = tuple(batches or concurrencies)
    on_step("correctness check")
    result = BenchResult(check=check("cuda"), device=torch.cuda.get_device_name())
    if not result.check.passed:
        return result
    on_step("copy bandwidth")
    result.copy_gbps = copy_bandwidth_gbps()
    gen = torch.Generator(device="cpu").manual_seed(0)
    R = _CFG.experts // _CFG.expert_parallel
    d, I = _CFG.hidden, _CFG.expert_width
    w13 = Mxfp4Experts(R, 2 * I, d, gen, "cpu")
    w2 = Mxfp4Experts(R, d, I, gen, "cpu")
    for w in (w13, w2):
        w.packed, w.scales = w.packed.cuda(), w.scales.cuda()
    per_expert = (w13.nbytes + w2.nbytes) // R
    limit, scale = _CFG.swiglu_limit, _CFG.routed_scale
    for c in concurrencies:
        on_step(f"C = {c}")
        sets = []
        for _ in range(SETS):
            ids, gates = routing(c, R, gen)
            sets.append((torch.randn(ids.shape[0], d, generator=gen).to("cuda", torch.bfloat16), ids, gates))
        torch.cuda.synchronize()  # do_bench_cudagraph times on a stream of its own

        def rotating(fn, cycle=itertools.cycle(sets)):
            def call():
                x, ids, gates = next(cycle)
                return fn(x, ids, gates, w13, w2, limit, scale)
            return call

        grouped_ms = _median_graph_ms(rotating(grouped_routed_experts))
        base_ms = _median_graph_ms(rotating(routed_experts_sm120))
        x, ids, _ = sets[0]
        hit = int(torch.unique(ids[ids >= 0]).numel())
        moved = hit * per_expert + 2 * x.numel() * x.element_size()
        floor_us = moved / (result.copy_gbps * 1e9) * 1e6
        result.rows.append(BenchRow(
            concurrency=c, tokens=ids.shape[0], experts_hit=hit, grouped_us=grouped_ms * 1e3, baseline_us=base_ms * 1e3,
            bytes_moved=moved, floor_us=floor_us, frac_floor=floor_us / (grouped_ms * 1e3),
            speedup_vs_baseline=base_ms / grouped_ms,
        ))
    return result


def render(result: BenchResult):
    """A rich table of the rows (or of the failed check), the check under it."""
    from dsv4opt.display import narrow_table

    if not result.check.passed:
        from dsv4opt.optimizations.gate_table import failed_table

        return failed_table("grouped-moe", result.check, ("rel_err", "baseline_rel_err"))
    table = narrow_table(f"grouped-moe on {result.device}: d {_CFG.hidden}, I {_CFG.expert_width}, "
                         f"{_CFG.experts // _CFG.expert_parallel} experts a rank, top-{_CFG.experts_per_token}; "
                         f"copy {result.copy_gbps:.0f} GB/s",
                         caption=f"check: {result.check.summary}", caption_justify="left")
    for col in ("C", "tokens", "experts\nhit", "grouped\nµs", "floor\nµs", "of\nfloor", "baseline\nµs", "x\nbaseline"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in result.rows:
        table.add_row(str(r.concurrency), str(r.tokens), str(r.experts_hit), f"{r.grouped_us:.1f}", f"{r.floor_us:.1f}",
                      f"{r.frac_floor:.0%}", f"{r.baseline_us:.1f}", f"{r.speedup_vs_baseline:.1f}")
    return table
