"""Launch the mma-attn kernels a few times on the bench's inputs, for Nsight Compute to profile.
Each launch takes the next of the bench's rotating input sets, so the profiled one reads rows that
are not in L2.

    ncu --clock-control none -k regex:_mma_sparse_decode_kernel --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section SourceCounters ... python3 scripts/ncu_mma_attn.py 64
    ... -k regex:gluon_sparse_decode ... python3 scripts/ncu_mma_attn.py 64 --gluon   # kernel_gluon.py alone
"""

from __future__ import annotations

import sys

import torch

from dsv4opt.optimizations.mma_attn.bench import DIM, POOL_GB, input_sets
from dsv4opt.optimizations.mma_attn.kernel import mma_sparse_decode


def main() -> int:
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    if "--gluon" in sys.argv:
        from dsv4opt.optimizations.mma_attn.bench import HEADS, TOPK
        from dsv4opt.optimizations.mma_attn.kernel import choose_tiles, split_chunks
        from dsv4opt.optimizations.mma_attn.kernel_gluon import gluon_sparse_decode_partials

        t = choose_tiles(batch, HEADS, TOPK, torch.device("cuda"), DIM)
        chunk, nsplit = split_chunks(TOPK, t.block_k, t.nsplit)
        o_part = torch.empty(batch, nsplit, HEADS, DIM, device="cuda")
        lse_part = torch.empty(batch, nsplit, HEADS, device="cuda")

        def run(q, kv, indices, lengths, sink, scale):
            gluon_sparse_decode_partials(q, kv, indices, lengths, o_part, lse_part, chunk, nsplit, scale)
    else:
        run = mma_sparse_decode
    gen = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(int(POOL_GB * 2**30) // (DIM * 2), DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    sets = input_sets(batch, kv, gen)
    for i in range(4):
        q, indices, lengths, sink = sets[i % len(sets)]
        run(q, kv, indices, lengths, sink, DIM**-0.5)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
