"""kernel.py's split combine alone, on fp32 against bf16 partials: the warp-specialised loops write
bf16 partials 3 µs faster at B = 64, but the call as a whole got slower, so the combine was suspect
(it was: docs/kernels/mma_attn.md).
Times it per B with the dispatch's split counts over rotating partial sets (far above L2),
CUDA-graph medians (bench.py's helper); --drive only calls it, for Nsight Compute:

    PYTHONPATH=. python3 scripts/probe_combine.py --batch 16,32,64 --json OUT
    ncu --kernel-name regex:_attn_combine --launch-skip 4 --launch-count 1 --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis_Tables python3 scripts/probe_combine.py --drive --part bf16

Diagnostic only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4opt.optimizations.mma_attn import bench as B  # noqa: E402
from dsv4opt.optimizations.mma_attn import kernel  # noqa: E402

SPLITS = {16: 5, 32: 4, 64: 2}  # the FP8 and bf16 warp-specialised loops' splits at K 512 + window 128
POOL_BYTES = 512 * 2**20


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


def combine_call(batch: int, nsplit: int, sets: list[tuple]):
    sink = torch.randn(B.HEADS, device="cuda")
    o = torch.empty(batch, B.HEADS, B.DIM, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(batch, B.HEADS, device="cuda")
    state = {"i": 0}

    def call():
        o_part, lse_part = sets[state["i"] % len(sets)]
        state["i"] += 1
        kernel._attn_combine_splits_kernel[(batch, B.HEADS)](
            p_o_part=o_part, p_lse_part=lse_part, p_sink=sink, p_o=o, p_lse=lse, stride_ob=o.stride(0),
            stride_oh=o.stride(1), H=B.HEADS, NSPLIT=nsplit, NS_P=triton.next_power_of_2(nsplit), D=B.DIM,
            D_P=B.DIM, SPLIT_LOOP=o_part.dtype != torch.float32, num_warps=4)

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
        call = combine_call(b, SPLITS[b], partial_sets(b, SPLITS[b], dtype, gen))
        for _ in range(8):
            call()
        torch.cuda.synchronize()
        return
    copy_gbps = B.copy_bandwidth_gbps()
    rows = []
    print(f"{torch.cuda.get_device_name()}, Triton {triton.__version__}; copy {copy_gbps:.0f} GB/s", flush=True)
    for b in batches:
        ns = SPLITS[b]
        row = {"batch": b, "nsplit": ns}
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            us = B._median_graph_ms(combine_call(b, ns, partial_sets(b, ns, dt, gen))) * 1e3
            moved = b * ns * B.HEADS * B.DIM * torch.tensor([], dtype=dt).element_size() + b * B.HEADS * B.DIM * 2
            row[name] = {"us": us, "bytes": moved, "of_copy_bandwidth": moved / (copy_gbps * 1e3 * us)}
            print(f"B {b:3d} x {ns} splits  {name} partials  {us:6.1f} us  {moved / 1e6:5.1f} MB  "
                  f"{row[name]['of_copy_bandwidth']:6.1%} of copy bandwidth", flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "copy_gbps": copy_gbps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
