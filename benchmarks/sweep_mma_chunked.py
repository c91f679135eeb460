"""mma-attn's chunked tile family (GPUs with less shared memory than Hopper) and variants of it, on a GPU.

    DSV4OPT_SHARED_MEMORY_LIMIT=101376 python3 benchmarks/sweep_mma_chunked.py [--batch 1,32,64] [--json OUT]

Each variant is checked against the float64 reference on the bench's inputs (FP8 cache, K 512 +
window 128, 64 heads of 512; NaN-poisoned outputs), then timed as the bench times (CUDA-graph
median over input sets rotated past L2). The planned tiles (`fitting_plan`, by the device's shared
memory or the cap) are timed first; variants change one thing at a time. A variant whose compiled
launch asks for more shared memory than the device (or the cap) allows is skipped, as the dispatch
would skip it. Prints a table; no assertion.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dsv4opt.numerics import error_report, nan_poisoned_allocations  # noqa: E402
from dsv4opt.optimizations import timing  # noqa: E402
from dsv4opt.optimizations.mma_attn import bench_inputs as inputs  # noqa: E402
from dsv4opt.optimizations.mma_attn import kernel  # noqa: E402
from dsv4opt.optimizations.mma_attn.bench_peers import reference  # noqa: E402
from dsv4opt.tritonlib import device_limits  # noqa: E402

VARIANTS = {  # name -> change to the planned tiles
    "planned": {},
    "stages2": {"num_stages": 2},
    "bk64": {"block_k": 64},
    "warps4": {"num_warps": 4},
    "split x4": "split4",
    "warps4 split x4": ("split4", {"num_warps": 4}),
    "stages2 warps4 split x4": ("split4", {"num_warps": 4, "num_stages": 2}),
}


def variant_tiles(planned: kernel.Tiles, change, topk: int) -> kernel.Tiles:
    changes = change if isinstance(change, tuple) else (change,)
    t = planned
    for c in changes:
        if c in ("split2", "split4"):
            t = replace(t, nsplit=min(t.nsplit * int(c[-1]), -(-topk // t.block_k)))
        elif c:
            t = replace(t, **c)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,32,64")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="names from VARIANTS (default: all)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    extra = inputs.pool_cache("fp8", gen)
    scale = inputs.DIM ** -0.5
    limit = device_limits(torch.device("cuda")).shared_per_block
    rows = []
    print(f"{torch.cuda.get_device_name()}, shared memory a block {limit:,} B (cap or device)", flush=True)
    for batch in (int(b) for b in a.batch.split(",")):
        swa = inputs.window_cache("fp8", batch, gen)
        sets = inputs.input_sets(batch, swa, extra, gen)
        q, swa_idx, swa_len, idx, lengths, sink = sets[0]
        planned = kernel.fitting_plan(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale)
        ref_o, ref_lse, _ = reference(sets[0], swa, extra, scale)
        topk = swa_idx.shape[1] + idx.shape[1]
        for name in a.variants.split(","):
            change = VARIANTS[name]
            tiles = variant_tiles(planned.tiles, change, topk)
            p = kernel.plan(q, swa, swa_idx, extra, idx, tiles) if change else planned
            need = (kernel._shared_bytes(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale, p, True)
                    if p.engine.startswith("triton") else 0)  # the Gluon loops: Hopper's shared memory
            row = {"batch": batch, "variant": name, "engine": p.engine, "tiles": asdict(tiles), "shared_bytes": need}
            if need > limit:
                row["skipped"] = f"needs {need:,} B"
            else:
                given = tiles if change else None  # the planned call as the dispatch makes it (Gluon where it applies)
                with nan_poisoned_allocations():
                    o, lse = kernel.mma_attention(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale, tiles=given)
                err = error_report(o, ref_o)
                row.update(rel_err_o=err.rel, nonfinite=err.nonfinite, lse_rel=error_report(lse, ref_lse).rel)
                if err.ok(1e-2) and row["lse_rel"] <= 1e-2:
                    fn = lambda q, swa, si, sl, ex, ei, el, sk, sc, t=given: kernel.mma_attention(q, swa, si, sl, ex, ei, el, sk, sc, tiles=t)  # noqa: E731
                    row["us"] = timing.median_graph_ms(inputs.rotating(fn, swa, extra, sets, scale)) * 1e3
            rows.append(row)
            t = row["tiles"]
            print(f"B={batch:3d} {name:18s} {p.engine:14s} bk{t['block_k']} w{t['num_warps']} s{t['num_stages']} bv{t['block_v']} "
                  f"bd{t['block_d']} split{t['nsplit']:3d} smem {need:6d} "
                  + (row.get("skipped") or f"rel {row['rel_err_o']:.1e} " + (f"{row['us']:8.1f} us" if "us" in row else "FAILED")),
                  flush=True)
        del sets
    if a.json:
        a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "limit": limit, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
