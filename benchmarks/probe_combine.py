"""kernel.py's split combine alone, on fp32 against bf16 partials: the warp-specialised loops write
bf16 partials 3 µs faster at B = 64, but the call as a whole got slower, so the combine was suspect
(it was: docs/kernels/mma_attn.md).
Times it per B with the dispatch's split counts over rotating partial sets (far above L2),
CUDA-graph medians (bench.py's helper); --drive only calls it, for Nsight Compute:

    PYTHONPATH=. python3 benchmarks/probe_combine.py --batch 16,32,64 --json OUT
    ncu --kernel-name regex:_attn_combine --launch-skip 4 --launch-count 1 --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis_Tables python3 benchmarks/probe_combine.py --drive --part bf16

Diagnostic only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4opt.optimizations.mma_attn import bench as B  # noqa: E402
from dsv4opt.optimizations.mma_attn import kernel  # noqa: E402

POOL_BYTES = 512 * 2**20


def splits(batch: int) -> int:
    """The dispatch's split count for the one-launch loops at K 512 + window 128 on this GPU."""
    slots = B.TOPK + B.WINDOW
    t = kernel.choose_tiles(batch, B.HEADS, slots, torch.device("cuda"), B.DIM, fp8=True)
    return kernel.split_chunks(slots, t.block_k, t.nsplit)[1]


def partial_sets(batch: int, nsplit: int, dtype: torch.dtype, gen: torch.Generator) -> list[tuple]:
    """Rotating (o_part, lse_part) sets, POOL_BYTES of o_part in all, random finite values."""
    one = batch * nsplit * B.HEADS * B.DIM * torch.tensor([], dtype=dtype).element_size()
    sets = []
    for _ in range(max(2, POOL_BYTES // one)):
        o_part = torch.randn(batch, nsplit, B.HEADS, B.DIM, device="cuda", generator=gen).to(dtype)
        lse_part = torch.randn(batch, nsplit, B.HEADS, device="cuda", generator=gen)
        sets.append((o_part, lse_part))
    torch.cuda.synchronize()
    return sets


def combine_call(batch: int, sets: list[tuple]):
    """kernel.combine_splits on the next set each call (a graph captured over many keeps the order)."""
    sink = torch.randn(B.HEADS, device="cuda")
    o = torch.empty(batch, B.HEADS, B.DIM, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(batch, B.HEADS, device="cuda")
    cycle = itertools.cycle(sets)

    def call():
        kernel.combine_splits(*next(cycle), sink, o, lse)

    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="16,32,64")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--drive", action="store_true", help="8 calls at the first B, no timing (for ncu)")
    ap.add_argument("--part", default="bf16", choices=("fp32", "bf16"), help="with --drive")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    batches = [int(b) for b in args.batch.split(",")]
    if args.drive:
        b = batches[0]
        dtype = torch.float32 if args.part == "fp32" else torch.bfloat16
        call = combine_call(b, partial_sets(b, splits(b), dtype, gen))
        for _ in range(8):
            call()
        torch.cuda.synchronize()
        return
    copy_gbps = B.copy_bandwidth_gbps()
    rows = []
    print(f"{torch.cuda.get_device_name()}, Triton {triton.__version__}; copy {copy_gbps:.0f} GB/s", flush=True)
    for b in batches:
        ns = splits(b)
        row = {"batch": b, "nsplit": ns}
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            us = B._median_graph_ms(combine_call(b, partial_sets(b, ns, dt, gen))) * 1e3
            moved = b * ns * B.HEADS * B.DIM * torch.tensor([], dtype=dt).element_size() + b * B.HEADS * B.DIM * 2
            row[name] = {"us": us, "bytes": moved, "of_copy_bandwidth": moved / (copy_gbps * 1e3 * us)}
            print(f"B {b:3d} x {ns} splits  {name} partials  {us:6.1f} us  {moved / 1e6:5.1f} MB  "
                  f"{row[name]['of_copy_bandwidth']:6.1%} of copy bandwidth", flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": copy_gbps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
