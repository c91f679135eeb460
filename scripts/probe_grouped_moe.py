"""grouped-moe tile variants on a GPU: each checked against the float64 definition (the model-shape
case of the gate), then timed as `dsv4opt bench grouped-moe` times (CUDA-graph replays, rotating
token sets) at each concurrency. Diagnostic only: committed figures come from `dsv4opt bench`.

    PYTHONPATH=. python3 scripts/probe_grouped_moe.py --concurrency 1,32 [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4opt.optimizations.grouped_moe import bench as B  # noqa: E402
from dsv4opt.optimizations.grouped_moe.cases import MoeCase  # noqa: E402
from dsv4opt.optimizations.grouped_moe.check import run_case  # noqa: E402
from dsv4opt.optimizations.grouped_moe.kernel import MoeTiles, grouped_routed_experts  # noqa: E402
from dsv4opt.optimizations.mma_attn.bench import _median_graph_ms, copy_bandwidth_gbps  # noqa: E402
from dsv4opt.workload.weights import Mxfp4Experts  # noqa: E402

D = MoeTiles()
VARIANTS = {
    "default": D,
    "w8": replace(D, up_warps=8, down_warps=8),
    "bn32": replace(D, up_bn=32, down_bn=32),
    "bn128-w8": replace(D, up_bn=128, up_warps=8, down_bn=128, down_warps=8),
    "bk256-w8-s2": replace(D, up_bk=256, up_warps=8, up_stages=2, down_bk=256, down_warps=8, down_stages=2),
    "s2": replace(D, up_stages=2, down_stages=2),
    "s4": replace(D, up_stages=4, down_stages=4),
    "bk64": replace(D, up_bk=64, down_bk=64),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json")
    args = ap.parse_args()
    copy_gbps = copy_bandwidth_gbps()
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbps:.0f} GB/s", flush=True)
    gen = torch.Generator().manual_seed(0)
    cfg = B._CFG
    R, d, I = cfg.experts // cfg.expert_parallel, cfg.hidden, cfg.expert_width
    w13, w2 = Mxfp4Experts(R, 2 * I, d, gen, "cpu"), Mxfp4Experts(R, d, I, gen, "cpu")
    for w in (w13, w2):
        w.packed, w.scales = w.packed.cuda(), w.scales.cuda()
    per_expert = (w13.nbytes + w2.nbytes) // R
    rows = []
    for name in args.variants.split(","):
        impl = partial(grouped_routed_experts, tiles=VARIANTS[name])
        try:
            err = run_case(MoeCase(256, "mixed"), torch.device("cuda"), torch.bfloat16, seed=1, impl=impl)["rel_err"]
        except Exception as exc:  # a variant that does not compile or fit is reported, not fatal
            print(f"{name:12s} FAILED: {str(exc).splitlines()[0][:160]}", flush=True)
            continue
        for c in (int(x) for x in args.concurrency.split(",")):
            sets = []
            for _ in range(B.SETS):
                ids, gates = B.routing(c, R, gen)
                sets.append((torch.randn(ids.shape[0], d, generator=gen).to("cuda", torch.bfloat16), ids, gates))
            torch.cuda.synchronize()
            cycle = itertools.cycle(sets)

            def call():
                x, ids, gates = next(cycle)
                return impl(x, ids, gates, w13, w2, cfg.swiglu_limit, cfg.routed_scale)

            us = _median_graph_ms(call) * 1e3 if err <= 1e-2 else float("nan")
            hit = int(torch.unique(sets[0][1][sets[0][1] >= 0]).numel())
            floor = (hit * per_expert) / (copy_gbps * 1e9) * 1e6
            rows.append({"variant": name, "tiles": asdict(VARIANTS[name]), "concurrency": c, "us": us, "rel_err": err,
                         "floor_us": floor})
            print(f"{name:12s} C {c:3d} {us:8.1f} us  floor {floor:6.1f} us ({floor / us:5.1%})  err {err:.1e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": copy_gbps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
