"""`dsv4opt bench grouped-moe`: the routed-experts slot against its bytes floor, triton_kernels' MoE
path (the anchor, when importable) and SGLang's per-slot path, for both layouts, in one table.

Runs the correctness gate first; when it fails, nothing is timed. Layouts (one rank of 8):
- tp4: the rank's own C tokens, all 256 experts resident, each sharded to I = 512; 6 slots a token.
- dp-ep: the 8C gathered tokens, 32 whole experts (I = 2048); the first C tokens' six slots on
  local experts (`e mod 32` of a random top-6, as the embedded model maps them), the rest -1.
Times are medians of CUDA-graph replays over rotating input sets, as many as make the set of
experts they touch three times the L2 (timing.sets_needed), so the weights come from HBM. The floor
counts the weights of the experts each set touches with 1-byte e8m0 scales, the tokens with a
local slot read and every output row written, over the copy bandwidth measured in the run.

    python -m dsv4opt.optimizations.grouped_moe.bench [--layout tp4,dp-ep] [--concurrency 1,16,32,64]
        [--no-baseline] [--sweep] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.fileio import finite
from dsv4opt.optimizations import timing
from dsv4opt.optimizations.timing import BenchOptions
from dsv4opt.workload.config import ModelConfig

CFG = ModelConfig.from_name("dsv4-flash")
CONCURRENCIES = (1, 16, 32, 64)
ANCHOR_TOL = 1e-2  # relative, as the gate in bf16


@dataclass(frozen=True)
class BenchLayout:
    """One rank's MoE: R experts of width I; tokens = token_ranks * C; slots of other ranks or not."""

    name: str
    experts: int
    width: int
    token_ranks: int

    @property
    def other_ranks(self) -> bool:
        return self.token_ranks > 1

    def expert_bytes(self, hidden: int) -> int:
        """One expert's e2m1 values and e8m0 scales: gate/up [2I, d] and down [d, I]."""
        values = 3 * self.width * hidden
        return values // 2 + values // 32

    def expected_experts(self, concurrency: int, topk: int, total: int) -> float:
        """Distinct local experts random routing touches: each of the C tokens picks top-k of `total`
        distinct experts; tp4 holds all of them, dp-ep local expert e takes the picks = e mod R."""
        if not self.other_ranks:
            return self.experts * (1 - (1 - topk / total) ** concurrency)
        per = total // self.experts  # globals mapping to one local expert
        miss = math.comb(total - per, topk) / math.comb(total, topk)
        return self.experts * (1 - miss**concurrency)


LAYOUTS = {
    "tp4": BenchLayout("tp4", CFG.experts, CFG.expert_width // 4, 1),
    "dp-ep": BenchLayout("dp-ep", CFG.experts // CFG.expert_parallel, CFG.expert_width, CFG.expert_parallel),
}


@dataclass(frozen=True)
class BenchRow:
    layout: str
    concurrency: int
    tokens: int  # rows of x the slot sees
    sets: int  # rotating input sets
    experts_hit: float  # distinct local experts a set touches, mean over the sets
    floor_us: float  # bytes floor (e8m0) over the copy bandwidth measured in this run
    grouped_us: float  # grouped-moe: the whole slot (routing, both GEMMs, activation, combine)
    frac_floor: float
    anchor_us: float | None = None  # triton_kernels: its routing and two GEMMs (no top-k sum)
    anchor_gemm_us: float | None = None  # its two GEMMs alone, routing done outside the timed call
    anchor_whole_us: float | None = None  # its routing, two GEMMs and the top-k sum in torch (the slot's output)
    anchor_frac_floor: float | None = None
    speedup_vs_anchor: float | None = None
    baseline_us: float | None = None  # SGLang's per-slot path
    speedup_vs_baseline: float | None = None
    route_us: float | None = None  # grouped-moe's routing launch alone
    rel_err: float | None = None  # grouped-moe on the first input set against the float64 definition
    config: str = ""

    @property
    def anchor_gemm_frac_floor(self) -> float | None:
        """triton_kernels' two GEMMs alone as a fraction of the floor."""
        return self.floor_us / self.anchor_gemm_us if self.anchor_gemm_us else None


@dataclass
class BenchResult(timing.BenchResult):
    anchor: str = "not importable"  # what happened to the anchor
    anchor_errors: dict = field(default_factory=dict)  # "layout C" -> rel err against its float64 definition
    rows: list[BenchRow] = field(default_factory=list)
    sweep: list[dict] = field(default_factory=list)

    def as_json(self) -> dict:
        check = self.check_json()
        return finite({"bench": "grouped-moe", "device": self.device, "copy_gbps": self.copy_gbps,
                        "anchor": self.anchor, "anchor_errors": self.anchor_errors, "hidden": CFG.hidden,
                        "topk": CFG.experts_per_token, "layouts": {k: asdict(v) for k, v in LAYOUTS.items()},
                        "check": check, "rows": [asdict(r) for r in self.rows], "sweep": self.sweep})


def routing(layout: BenchLayout, concurrency: int, gen: torch.Generator, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """(local_ids, gates) of one input set."""
    k, total = CFG.experts_per_token, CFG.experts
    M = layout.token_ranks * concurrency
    ids = torch.full((M, k), -1, dtype=torch.int32)
    picks = torch.stack([torch.randperm(total, generator=gen)[:k] for _ in range(concurrency)])
    ids[:concurrency] = (picks % layout.experts).to(torch.int32)
    gates = torch.rand(M, k, generator=gen)
    return ids.to(device), (gates / gates.sum(-1, keepdim=True)).to(device)


def floor_bytes(layout: BenchLayout, ids: torch.Tensor, hidden: int, elem: int = 2) -> tuple[int, int]:
    """(bytes the slot must move, distinct experts): weights of the experts touched (e8m0 scales),
    the token rows with a local slot read, every output row written."""
    hit = int(torch.unique(ids[ids >= 0]).numel())
    rows_read = int((ids >= 0).any(1).sum())
    return hit * layout.expert_bytes(hidden) + (rows_read + ids.shape[0]) * hidden * elem, hit


def layout_weights(layout: BenchLayout, gen: torch.Generator):
    """Random MXFP4 gate/up and down experts of the layout, on the GPU (the probes in benchmarks/ use them too)."""
    from dsv4opt.workload.weights import Mxfp4Experts

    d, I, R = CFG.hidden, layout.width, layout.experts
    w13, w2 = Mxfp4Experts(R, 2 * I, d, gen, "cpu"), Mxfp4Experts(R, d, I, gen, "cpu")
    for w in (w13, w2):
        w.packed, w.scales = w.packed.cuda(), w.scales.cuda()
    return w13, w2


def layout_input_sets(layout: BenchLayout, c: int, gen: torch.Generator) -> list[tuple]:
    """Rotating (x, local ids, gates) sets at concurrency c, enough to read L2_SPAN L2s of experts."""
    from dsv4opt.optimizations.timing import sets_needed

    def one():
        ids, gates = routing(layout, c, gen)
        return torch.randn(ids.shape[0], CFG.hidden, generator=gen).to("cuda", torch.bfloat16), ids, gates

    first = one()
    per_call = floor_bytes(layout, first[1], CFG.hidden)[0]
    n = sets_needed(per_call, torch.cuda.get_device_properties(0).L2_cache_size)
    return [first] + [one() for _ in range(n - 1)]


def _rotating(fn, sets, *weights):
    cycle = itertools.cycle(sets)

    def call():
        x, ids, gates = next(cycle)
        return fn(x, ids, gates, *weights, CFG.swiglu_limit, CFG.routed_scale)

    return call


def _time(fn) -> float:
    """µs per call, median of CUDA-graph replays, after one eager call (repacks happen there)."""
    from dsv4opt.optimizations.timing import median_graph_ms

    fn()
    torch.cuda.synchronize()
    return median_graph_ms(fn) * 1e3


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    from dsv4opt.numerics import error_report

    e = error_report(out, ref)
    return float("inf") if e.nonfinite else e.rel


def run_bench(options: BenchOptions = BenchOptions(), *, layouts: Sequence[str] = ("tp4", "dp-ep"),
              baseline: bool = True) -> BenchResult:
    """Check, then time grouped-moe, the anchor and the baseline for each layout and concurrency
    (options.batches; `baseline=False` skips SGLang's per-slot path, slow at large C)."""
    if not torch.cuda.is_available():
        raise DsvOptError("dsv4opt bench grouped-moe needs a CUDA GPU (on a CPU only the correctness check runs, under Triton's interpreter)")
    from dsv4opt.optimizations.grouped_moe import anchor
    from dsv4opt.optimizations.grouped_moe.check import check
    from dsv4opt.workload.kernels.grouped_moe import grouped_routed_experts, route, table_config
    from dsv4opt.optimizations.timing import copy_bandwidth_gbps
    from dsv4opt.workload.baseline import routed_experts_sm120
    from dsv4opt.workload.kernels import naive

    concurrencies, on_step = tuple(options.batches or CONCURRENCIES), options.on_step
    on_step("correctness check")
    result = BenchResult(check=check("cuda"), device=torch.cuda.get_device_name())
    if not result.check.passed:
        return result
    on_step("copy bandwidth")
    result.copy_gbps = copy_bandwidth_gbps()
    use_anchor = anchor.available()
    result.anchor = "triton_kernels" if use_anchor else "not importable (put triton_kernels on PYTHONPATH)"
    gen = torch.Generator(device="cpu").manual_seed(0)
    for name in layouts:
        lay = LAYOUTS[name]
        w13, w2 = layout_weights(lay, gen)
        tk = anchor.TritonKernelsMoe(w13, w2, CFG.swiglu_limit) if use_anchor else None
        for c in concurrencies:
            on_step(f"{name} C = {c}")
            sets = layout_input_sets(lay, c, gen)
            torch.cuda.synchronize()
            floors = [floor_bytes(lay, ids, CFG.hidden) for _, ids, _ in sets]
            floor_us = sum(b for b, _ in floors) / len(floors) / (result.copy_gbps * 1e9) * 1e6
            ours = _time(_rotating(grouped_routed_experts, sets, w13, w2))
            ids_cycle = itertools.cycle([ids for _, ids, _ in sets])
            cfg = table_config(sets[0][0], lay.experts, lay.width, sets[0][1].numel())  # what grouped_routed_experts runs
            bm = cfg.bm
            route_us = _time(lambda: route(next(ids_cycle), lay.experts, bm))
            x, ids, gates = sets[0]
            mine = _rel(grouped_routed_experts(x, ids, gates, w13, w2, CFG.swiglu_limit, CFG.routed_scale),
                        naive.routed_experts(x.double(), ids, gates.double(), w13, w2, CFG.swiglu_limit,
                                             CFG.routed_scale))
            row = dict(layout=name, concurrency=c, tokens=sets[0][0].shape[0], sets=len(sets),
                       experts_hit=sum(h for _, h in floors) / len(floors), floor_us=floor_us, grouped_us=ours,
                       frac_floor=floor_us / ours,
                       route_us=route_us, rel_err=mine, config=cfg.name)
            if tk is not None:
                x, ids, gates = sets[0]
                ref = anchor.reference(x, ids, gates, w13, w2, CFG.swiglu_limit, CFG.routed_scale)
                err = _rel(tk(x, ids, gates, w13, w2, CFG.swiglu_limit, CFG.routed_scale), ref)
                result.anchor_errors[f"{name} C={c}"] = err
                if err <= ANCHOR_TOL:
                    whole = _time(_rotating(tk, sets, w13, w2))
                    routed_gemms = _time(_rotating(tk.routed_gemms, sets, w13, w2))
                    routed = [(x, tk.route(ids, gates)) for x, ids, gates in sets]
                    cycle = itertools.cycle(routed)

                    def gemms():
                        x, r = next(cycle)
                        return tk.gemms(x, r)

                    row.update(anchor_us=routed_gemms, anchor_gemm_us=_time(gemms), anchor_whole_us=whole,
                               anchor_frac_floor=floor_us / routed_gemms, speedup_vs_anchor=routed_gemms / ours)
            if baseline:
                base = _time(_rotating(routed_experts_sm120, sets, w13, w2))
                row.update(baseline_us=base, speedup_vs_baseline=base / ours)
            result.rows.append(BenchRow(**row))
        del w13, w2, tk
        torch.cuda.empty_cache()
    return result


def swept(cands: Sequence, table, match: str | None) -> list:
    """The candidates whose names match (a regular expression), the table's own config always first,
    so that each row of a narrowed sweep is timed beside what it would replace."""
    if match is None:
        return list(cands)
    pattern = re.compile(match)
    return [table] + [c for c in cands if c != table and pattern.search(c.name)]


def run_sweep(concurrencies: Sequence[int] = CONCURRENCIES, layouts: Sequence[str] = ("tp4", "dp-ep"),
              on_step: Callable[[str], None] = print, match: str | None = None) -> list[dict]:
    """Each candidate config (configs.candidates) of each layout and concurrency, or those whose names
    match: checked against the float64 definition on the first input set, then timed as the bench
    times. Diagnostic: the table in configs.py is edited by hand from what this prints."""
    from dsv4opt.workload.kernels.grouped_moe import candidates, grouped_routed_experts, table_config, ws_runs_on
    from dsv4opt.optimizations.timing import copy_bandwidth_gbps
    from dsv4opt.workload.kernels import naive

    copy = copy_bandwidth_gbps()
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for name in layouts:
        lay = LAYOUTS[name]
        w13, w2 = layout_weights(lay, gen)
        for c in concurrencies:
            sets = layout_input_sets(lay, c, gen)
            floors = [floor_bytes(lay, ids, CFG.hidden)[0] for _, ids, _ in sets]
            floor_us = sum(floors) / len(floors) / (copy * 1e9) * 1e6
            x, ids, gates = sets[0]
            ref = naive.routed_experts(x.double(), ids, gates.double(), w13, w2, CFG.swiglu_limit, CFG.routed_scale)
            table = table_config(x, lay.experts, lay.width, ids.numel())
            for cfg in swept(candidates(lay.experts, lay.width, CFG.hidden, ids.numel()), table, match):
                def impl(x, ids, gates, w13, w2, limit, scale, cfg=cfg):
                    return grouped_routed_experts(x, ids, gates, w13, w2, limit, scale, config=cfg)

                if (cfg.up.gluon or cfg.down.gluon) and not ws_runs_on(x):
                    on_step(f"{name:5} C={c:<3}   {cfg.name:48} skipped: the Gluon kernels do not run here")
                    continue
                try:
                    err = _rel(impl(x, ids, gates, w13, w2, CFG.swiglu_limit, CFG.routed_scale), ref)
                    us = _time(_rotating(impl, sets, w13, w2)) if err <= ANCHOR_TOL else float("nan")
                    note = "" if err <= ANCHOR_TOL else "FAILED check"
                except Exception as exc:  # noqa: BLE001  (a candidate that does not compile or fit is reported, not fatal)
                    err, us, note = float("nan"), float("nan"), f"{type(exc).__name__}: {str(exc)[:60]}"
                row = dict(layout=name, concurrency=c, config=cfg.name, table=cfg == table, us=us,
                           frac_floor=floor_us / us if us == us else float("nan"), floor_us=floor_us, rel_err=err, note=note)
                rows.append(row)
                on_step(f"{name:5} C={c:<3} {'*' if row['table'] else ' '} {cfg.name:48} {us:8.1f} µs "
                        f"{row['frac_floor']:6.1%} of {floor_us:.1f}  rel {err:.1e} {note}")
        del w13, w2
        torch.cuda.empty_cache()
    return rows


def render(result: BenchResult):
    """A rich table of the rows (or of the failed check), the check and the anchor under it."""
    from dsv4opt.display import narrow_table

    if not result.check.passed:
        from dsv4opt.optimizations.gate_table import failed_table

        return failed_table("grouped-moe", result.check, ("rel_err", "baseline_rel_err"))
    worst = max(result.anchor_errors.values(), default=None)
    caption = (f"hit: local experts a set touches; %fl: the floor over the time; ours: the whole slot; tk: "
               f"triton_kernels' routing and two GEMMs (its top-k sum: JSON); tk mm: its two GEMMs alone; x tk, x base: its "
               f"time, SGLang's per-slot path's, over ours\n"
               f"check: {result.check.summary}\nanchor: {result.anchor}") + (
        f", worst rel err {worst:.1e} against its float64 definition" if worst is not None else "")
    table = narrow_table(f"grouped-moe on {result.device}: d {CFG.hidden}, top-{CFG.experts_per_token}, "
                         f"copy {result.copy_gbps:.0f} GB/s; floor with e8m0 scales",
                         caption=caption, caption_justify="left")
    for col in ("layout", "C", "hit", "floor\nµs", "ours\nµs", "ours\n%fl", "tk\nµs", "tk\n%fl", "tk mm\n%fl", "x\ntk",
                "x\nbase"):
        table.add_column(col, justify="right", no_wrap=True)

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in result.rows:
        table.add_row(r.layout, str(r.concurrency), f"{r.experts_hit:.1f}", f"{r.floor_us:.1f}", f"{r.grouped_us:.1f}",
                      f"{r.frac_floor:.0%}", f(r.anchor_us, ".1f"), f(r.anchor_frac_floor, ".0%"),
                      f(r.anchor_gemm_frac_floor, ".0%"),
                      f(r.speedup_vs_anchor, ".2f"), f(r.speedup_vs_baseline, ".0f"))
    return table


def main(argv: Sequence[str] | None = None) -> None:
    from rich.console import Console

    from dsv4opt.fileio import check_new_file, write_json_atomic

    ap = argparse.ArgumentParser(prog="python -m dsv4opt.optimizations.grouped_moe.bench")
    ap.add_argument("--layout", default="tp4,dp-ep")
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCIES)))
    ap.add_argument("--no-baseline", action="store_true", help="skip SGLang's per-slot path (slow at large C)")
    ap.add_argument("--sweep", action="store_true", help="time every candidate config instead of the table")
    ap.add_argument("--match", help="sweep only the candidates whose names match this regular expression "
                    "(the table's config is always timed beside them)")
    ap.add_argument("--json", help="also write the results here (refused if it exists)")
    args = ap.parse_args(argv)
    if args.match is not None:
        if not args.sweep:
            raise SystemExit("--match narrows a sweep: give --sweep too")
        try:
            re.compile(args.match)
        except re.error as err:
            raise SystemExit(f"--match is not a regular expression: {err}") from None
    layouts = [v for v in args.layout.split(",") if v]
    unknown = set(layouts) - set(LAYOUTS)
    if unknown:
        raise SystemExit(f"unknown layout {sorted(unknown)}: choose from {', '.join(LAYOUTS)}")
    conc = tuple(int(v) for v in args.concurrency.split(","))
    console = Console()
    try:
        check_new_file(args.json, False, "--json")
        if not torch.cuda.is_available():
            raise DsvOptError("the grouped-moe bench needs a CUDA GPU")
        if args.sweep:
            rows = run_sweep(conc, layouts, on_step=console.print, match=args.match)
            payload = {"bench": "grouped-moe sweep", "device": torch.cuda.get_device_name(), "rows": rows}
        else:
            result = run_bench(BenchOptions(batches=conc, on_step=lambda m: console.print(f"[dim]{m}[/dim]")),
                               layouts=layouts, baseline=not args.no_baseline)
            console.print(render(result))
            payload = result.as_json()
    except DsvOptError as err:
        console.print(f"[red]{err}[/red]")
        raise SystemExit(1) from None
    if args.json:
        write_json_atomic(args.json, finite(payload), make_dirs=False)



if __name__ == "__main__":
    main()
