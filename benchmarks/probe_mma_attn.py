"""mma-attn tile variants on a GPU: each checked against the float64 reference, then timed the way
`dsv4opt bench mma-attn` times (CUDA-graph replays over rotating input sets larger than L2).

    PYTHONPATH=. python3 benchmarks/probe_mma_attn.py --kv fp8 --batch 1,16,32,64 [--json out.json]

Variants are named overrides of the tiles `choose_tiles` picks for each B (see VARIANTS); the
default row is what the dispatch runs. Prints one line a (B, variant): median µs, fraction of the
copy bandwidth and of the larger floor, and the worst relative error; no speed-up for a variant
that fails its check. Diagnostic only: the committed figures come from `dsv4opt bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4opt.numerics import error_report  # noqa: E402
from dsv4opt.optimizations.mma_attn import bench as B  # noqa: E402
from dsv4opt.optimizations.mma_attn import kernel  # noqa: E402
from dsv4opt.workload.attention import sparse_attention_ref  # noqa: E402

# name -> fields replaced in the dispatch's tiles (nsplit then re-derived for the new block_k)
VARIANTS = {
    "default": {},
    "bk32-s3": {"block_k": 32, "num_warps": 8, "num_stages": 3, "block_v": 0, "reload_v": False},
    "bk64-s2": {"block_k": 64, "num_warps": 8, "num_stages": 2, "block_v": 0, "reload_v": False},
    "v128-bk32": {"block_k": 32, "num_warps": 4, "num_stages": 3, "block_v": 128, "reload_v": True},
    "v128-bk16": {"block_k": 16, "num_warps": 4, "num_stages": 3, "block_v": 128, "reload_v": True},
    "v256-bk32": {"block_k": 32, "num_warps": 8, "num_stages": 3, "block_v": 256, "reload_v": True},
}


def variant_tiles(name: str, batch: int, kv: str) -> kernel.Tiles:
    base = kernel.choose_tiles(batch, B.HEADS, B.TOPK + B.WINDOW, torch.device("cuda"), B.DIM, fp8=kv == "fp8")
    fields = VARIANTS[name]
    if not fields:
        return base
    t = replace(base, **fields)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = batch * (512 // t.block_v if t.block_v else 1)
    nsplit = max(1, min(round(sms / programs), -(-(B.TOPK + B.WINDOW) // t.block_k)))
    return replace(t, nsplit=nsplit)


def checked(fn, x) -> float:
    """Worst relative error of (o, lse) against the float64 reference on one input set."""
    o, lse = fn(*x)
    ref_o, ref_lse = sparse_attention_ref(*x)
    return max(error_report(o, ref_o).rel, error_report(lse, ref_lse).rel)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", default="fp8", choices=("fp8", "bf16"))
    ap.add_argument("--batch", default="1,16,32,64")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json")
    args = ap.parse_args()
    names = args.variants.split(",")
    copy_gbps, tflops = B.copy_bandwidth_gbps(), B.matmul_tflops()
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbps:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    extra = B.pool_cache(args.kv, gen)
    layout = extra.layout
    scale = B.DIM**-0.5
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        swa = B.window_cache(args.kv, batch, gen)
        sets = B.input_sets(batch, swa, extra, gen)
        q, swa_idx, swa_len, idx, lengths, sink = sets[0]
        x = (q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale)
        unique = int(torch.unique(swa_idx).numel()) + int(torch.unique(idx).numel())
        moved = unique * layout.token_bytes + 2 * q.numel() * q.element_size()
        floor_us = max(moved / (copy_gbps * 1e9), 2 * 2 * batch * B.HEADS * (B.TOPK + B.WINDOW) * B.DIM / (tflops * 1e12)) * 1e6
        for name in names:
            tiles = variant_tiles(name, batch, args.kv)

            def fn(*a, tiles=tiles):
                return kernel.mma_attention(*a, tiles=tiles)

            try:
                err = checked(fn, x)
                us = B._median_graph_ms(B.rotating(fn, swa, extra, sets, scale)) * 1e3 if err <= 1e-2 else float("nan")
            except Exception as exc:  # a variant that does not compile or fit is reported, not fatal
                err, us = float("nan"), float("nan")
                print(f"B {batch:3d} {name:12s} FAILED: {str(exc).splitlines()[0][:160]}", flush=True)
            p = kernel.plan(q, swa, swa_idx, extra, idx, tiles)
            row = {"batch": batch, "variant": name, "tiles": str(p.tiles), "engine": p.engine, "us": us,
                   "rel_err": err, "frac_copy_bw": moved / (us * 1e-6) / (copy_gbps * 1e9) if us == us else None,
                   "frac_roofline": floor_us / us if us == us else None}
            rows.append(row)
            print(f"B {batch:3d} {name:12s} {us:8.1f} us  roofline {row['frac_roofline'] or 0:6.1%}  copy bw "
                  f"{row['frac_copy_bw'] or 0:6.1%}  err {err:.1e}  {p.engine} {p.tiles}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": copy_gbps,
                                               "matmul_tflops": tflops, "kv": args.kv, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
