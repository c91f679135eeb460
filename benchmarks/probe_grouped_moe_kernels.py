"""Where grouped-moe's time goes, launch by launch: routing, gate/up, down, combine, on the bench's
own weights and rotating input sets, under torch.profiler (GPU only).

    PYTHONPATH=. python3 benchmarks/probe_grouped_moe_kernels.py [--layout tp4,dp-ep] [--concurrency 1,16,32,64]
        [--calls 30] [--match REGEX] [--json OUT]

`--match`: the first sweep candidate whose name matches instead of the table's config (the table's
own is the first candidate: `--match "r128"` for the Triton row a warp-specialised one replaced). Prints, per layout and C, each kernel's mean µs a call (the profiler's device time, not a CUDA-graph
median: launch gaps are not in it) beside the bench's floor, so the slot's gap to its floor can be
split among its launches. `--drive N`: N calls on the rotating sets and no profiler, for Nsight
Compute (each rotating set runs once first, to build the weights' copy and compile: tp4 C = 1 has
8-9 sets, under 20 launches, so skip more than those):

    ncu --kernel-name regex:_moe_ --launch-skip 40 --launch-count 2 --section SpeedOfLight \
        --section WarpStateStats --section Occupancy --section LaunchStats \
        python3 benchmarks/probe_grouped_moe_kernels.py --layout tp4 --concurrency 1 --drive 30
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from collections import defaultdict

import torch

from dsv4opt.optimizations.grouped_moe import bench
from dsv4opt.workload.kernels.grouped_moe import grouped_routed_experts, table_config
from dsv4opt.workload.kernels.grouped_moe.configs import candidates
from dsv4opt.optimizations.timing import copy_bandwidth_gbps


def _config(lay, x: torch.Tensor, slots: int, match: str | None):
    """The table's config as the slot chooses it on x, or the first candidate whose name matches `match`."""
    if match is None:
        return table_config(x, lay.experts, lay.width, slots)
    found = [c for c in candidates(lay.experts, lay.width, x.shape[1], slots) if re.search(match, c.name)]
    if not found:
        raise SystemExit(f"no candidate config matches {match!r} here")
    return found[0]


def _slot_calls(layout_name: str, concurrency: int, gen: torch.Generator, weights, match: str | None = None):
    """The slot on the bench's rotating input sets, each set run once (the production-layout copies and
    the compiles happen here): an endless cycle of calls."""
    lay = bench.LAYOUTS[layout_name]
    sets = bench.layout_input_sets(lay, concurrency, gen)
    w13, w2 = weights
    cfg = bench.CFG
    config = _config(lay, sets[0][0], sets[0][1].numel(), match)
    print(f"{layout_name} C = {concurrency}: {config.name}")
    run = lambda x, ids, g: grouped_routed_experts(x, ids, g, w13, w2, cfg.swiglu_limit, cfg.routed_scale,  # noqa: E731
                                                   config=config)
    for x, ids, g in sets:
        run(x, ids, g)
    torch.cuda.synchronize()
    return run, itertools.cycle(sets)


def drive(layout_name: str, concurrency: int, calls: int, gen: torch.Generator, weights, match=None) -> None:
    """`calls` calls and nothing else (for a profiler outside the process)."""
    run, cycle = _slot_calls(layout_name, concurrency, gen, weights, match)
    for _ in range(calls):
        run(*next(cycle))
    torch.cuda.synchronize()


def kernel_means(layout_name: str, concurrency: int, calls: int, gen: torch.Generator, weights,
                 match: str | None = None) -> dict[str, float]:
    run, cycle = _slot_calls(layout_name, concurrency, gen, weights, match)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run(*next(cycle))
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time
    return {name: us / calls for name, us in sorted(total.items(), key=lambda kv: -kv[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", default="tp4,dp-ep")
    ap.add_argument("--concurrency", default="1,16,32,64")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--match", help="the first sweep candidate whose name matches, not the table's config")
    ap.add_argument("--drive", type=int, default=0, help="N calls a layout and C, no profiler (for Nsight Compute)")
    a = ap.parse_args()
    copy = None if a.drive else copy_bandwidth_gbps()
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for name in a.layout.split(","):
        lay = bench.LAYOUTS[name]
        weights = bench.layout_weights(lay, gen)
        for c in map(int, a.concurrency.split(",")):
            if a.drive:
                drive(name, c, a.drive, gen, weights, a.match)
                continue
            means = kernel_means(name, c, a.calls, gen, weights, a.match)
            ids = bench.routing(lay, c, gen)[0]
            floor_us = bench.floor_bytes(lay, ids, bench.CFG.hidden)[0] / (copy * 1e9) * 1e6
            rows.append(dict(layout=name, concurrency=c, floor_us=floor_us, kernels=means))
            print(f"{name} C = {c}: floor {floor_us:.1f} µs, kernels {sum(means.values()):.1f} µs a call")
            for k, us in means.items():
                print(f"    {us:8.1f} µs  {k[:90]}")
        del weights
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "x") as f:
            json.dump(dict(copy_gbps=copy, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
