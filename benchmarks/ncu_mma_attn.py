"""Drive mma-attn for Nsight Compute: a few calls on rotating input sets (rows out of L2), so that
`ncu --kernel-name regex:_mma_sparse --launch-skip 4 --launch-count 1` profiles a call that reads
from HBM. The tiles are the dispatch's unless --variant names one of probe_mma_attn.VARIANTS.

    ncu --kernel-name regex:_mma_sparse --launch-skip 4 --launch-count 1 --section SpeedOfLight \\
        --section WarpStateStats --section MemoryWorkloadAnalysis_Tables \\
        python3 benchmarks/ncu_mma_attn.py --batch 64 --kv fp8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dsv4opt.optimizations.mma_attn import bench as B  # noqa: E402
from dsv4opt.optimizations.mma_attn import kernel  # noqa: E402
from probe_mma_attn import variant_tiles  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--kv", default="fp8", choices=("fp8", "bf16"))
    ap.add_argument("--variant", default="default")
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    extra = B.pool_cache(args.kv, gen)
    swa = B.window_cache(args.kv, args.batch, gen)
    sets = B.input_sets(args.batch, swa, extra, gen)
    tiles = variant_tiles(args.variant, args.batch, args.kv)
    call = B.rotating(lambda *a: kernel.mma_attention(*a, tiles=tiles), swa, extra, sets, B.DIM**-0.5)
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    print("plan:", kernel.plan(sets[0][0], swa, sets[0][1], extra, sets[0][3], tiles))


if __name__ == "__main__":
    main()
