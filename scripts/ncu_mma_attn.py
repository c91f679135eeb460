"""Launch the mma-attn kernels a few times on the bench's inputs, for Nsight Compute to profile.

    ncu --clock-control none -k regex:_mma_sparse_decode_kernel --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section SourceCounters ... python3 scripts/ncu_mma_attn.py 64
"""

from __future__ import annotations

import sys

import torch

from dsv4opt.optimizations.mma_attn.bench import DIM, POOL_GB, bench_inputs
from dsv4opt.optimizations.mma_attn.kernel import mma_sparse_decode


def main() -> int:
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(int(POOL_GB * 2**30) // (DIM * 2), DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, indices, lengths, sink = bench_inputs(batch, kv, gen)
    for _ in range(4):
        mma_sparse_decode(q, kv, indices, lengths, sink, DIM**-0.5)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
