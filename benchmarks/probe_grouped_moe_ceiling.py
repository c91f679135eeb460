"""How fast grouped-moe's weight stream can go, stage by stage: load only, load and decode, decode and MMA.

    PYTHONPATH=. python3 benchmarks/probe_grouped_moe_ceiling.py [--layout tp4,dp-ep] [--ctas 3,4] [--json OUT]

Streams every expert's gate/up weights of the bench's layout (tp4: 256 experts x 1024 x 4096, 570 MB
with e8m0 scales; dp-ep: 32 x 4096 x 4096, 285 MB) through the production kernel's tiling (2 x 64
stacked rows x 128 columns a K step, 4 warps, 4 stages, persistent) in three modes, each a CUDA-graph
median (GPU only; `tests/optimizations/test_grouped_moe_ceiling.py` checks what each mode computes):

- load: the same 16-byte value loads and 4-byte scale loads, folded into one XOR a word;
- decode: the same loads decoded to bf16 (`_unit_tile`, as the kernel does) and summed element-wise
  (the sum takes the tile out of the MMA operand layout through shared memory, so this mode runs
  slower than mma on the H200: it is not a bound on the decode alone);
- mma: the decoded tile times a fixed [128, 16] token tile on the tensor core (the gate/up kernel
  without its gather, split or epilogue).

The weights are far larger than L2, so no rotation is needed. Each mode's bytes over its time, as a
fraction of the measured copy bandwidth, says which stage caps the GEMMs: where `mma` stays under
`load` whatever the bytes in flight, the decode's and the MMA's instructions are the ceiling
(docs/optimizations/grouped_moe.md, "The weight stream's ceiling"). The kernel internals it drives
(`_unit_tile`, `_persistent`) are the production kernel's own, on purpose.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from dsv4opt.optimizations.grouped_moe import bench
from dsv4opt.optimizations.timing import copy_bandwidth_gbps, median_graph_ms
from dsv4opt.workload.kernels.grouped_moe.kernel import _persistent, _unit_tile
from dsv4opt.workload.kernels.grouped_moe.configs import GemmTiles
from dsv4opt.workload.kernels.grouped_moe.layout import packed_experts
from dsv4opt.tritonlib import interpreted

MODES = ("load", "decode", "mma")


@triton.jit
def _stream_kernel(p_w, p_w32, p_s, p_s32, p_x, p_out, num_progs, n_items, n_blk, K64,
                   BN: tl.constexpr, BK: tl.constexpr, MODE: tl.constexpr, FOLD: tl.constexpr,
                   EMULATE: tl.constexpr, WHOLE: tl.constexpr):
    """Persistent over items (expert, 2 BN stacked rows), every K step of an item in turn. Each item
    leaves one number at p_out[item] (its XOR sum, or the sum of its tile); WHOLE (the tests) leaves
    its whole tile instead: decode [2 BN, BK] summed over the K steps, mma [2 BN, 16]."""
    pid = tl.program_id(0)
    dt = p_x.dtype.element_ty
    U_N: tl.constexpr = 2 * BN // 16
    U_K: tl.constexpr = BK // 64
    steps = K64 // U_K
    for w in range(pid, n_items, num_progs):
        rows = (w // n_blk) * (U_N * n_blk) + (w % n_blk) * U_N + tl.arange(0, U_N)  # [U_N] 16-row units
        if MODE == 0:
            b_v = tl.zeros([U_N, U_K, 32, 4], tl.int32)  # value words XORed over the K steps
            b_sc = tl.zeros([U_N, U_K, 8], tl.int32)  # scale words
            for i in range(steps):
                unit = rows.to(tl.int64)[:, None, None, None] * K64 + i * U_K + tl.arange(0, U_K)[None, :, None, None]
                b_v ^= tl.load(p_w32 + unit * 128 + tl.arange(0, 32)[None, None, :, None] * 4
                               + tl.arange(0, 4)[None, None, None, :])
                b_sc ^= tl.load(p_s32 + tl.reshape(unit, [U_N, U_K, 1]) * 8 + tl.arange(0, 8)[None, None, :])
            tot = tl.sum(tl.reshape(b_v, [U_N * U_K * 128]), 0) + tl.sum(tl.reshape(b_sc, [U_N * U_K * 8]), 0)
            tl.store(p_out + w, tot.to(tl.float32))
        elif MODE == 1:
            b_t = tl.zeros([2 * BN, BK], dt)  # [2 BN, BK] decoded tiles summed over the K steps
            for i in range(steps):
                b_t += _unit_tile(p_w, p_s, rows, rows >= 0, i * U_K, K64, U_N, U_K, FOLD, EMULATE, False, dt)
            if WHOLE:
                tl.store(p_out + w * (2 * BN * BK) + tl.arange(0, 2 * BN)[:, None] * BK + tl.arange(0, BK)[None, :],
                         b_t.to(tl.float32))
            else:
                tl.store(p_out + w, tl.sum(tl.sum(b_t.to(tl.float32), 1), 0))
        else:
            b_x = tl.load(p_x + tl.arange(0, BK)[:, None] * 16 + tl.arange(0, 16)[None, :])  # [BK, 16], L1-resident
            b_o = tl.zeros([2 * BN, 16], tl.float32)  # [2 BN, 16]
            for i in range(steps):
                b_wt = _unit_tile(p_w, p_s, rows, rows >= 0, i * U_K, K64, U_N, U_K, FOLD, EMULATE, False, dt)
                b_o = tl.dot(b_wt, b_x, b_o)
            if WHOLE:
                tl.store(p_out + w * (2 * BN * 16) + tl.arange(0, 2 * BN)[:, None] * 16 + tl.arange(0, 16)[None, :], b_o)
            else:
                tl.store(p_out + w, tl.sum(tl.sum(b_o, 1), 0))


def stream_rates(packed, copy_gbps: float, tiles: GemmTiles, modes=MODES, dtype=torch.bfloat16,
                 x: torch.Tensor | None = None, whole: bool = False) -> list[dict]:
    """Each mode's µs and GB/s over all of `packed`'s experts (values and scales read once), or with
    `whole` (the tests) each mode's output per item (`out`: [items] for load, [items, 2 bn, bk] for
    decode, [items, 2 bn, 16] for mma) and no timing. x: the mma mode's [bk, 16] token tile (random if None)."""
    n_blk = packed.n16 * 16 // (2 * tiles.bn)
    n_items = packed.experts * n_blk
    dev = packed.values.device
    x = torch.randn(tiles.bk, 16, device=dev, dtype=dtype) if x is None else x
    rows = []
    for name in modes:
        shape = {"load": (n_items,), "decode": (n_items, 2 * tiles.bn, tiles.bk), "mma": (n_items, 2 * tiles.bn, 16)}
        out = torch.full(shape[name] if whole else (n_items,), float("nan"), device=dev)

        def run(mode=MODES.index(name), out=out):
            _persistent(_stream_kernel, dev, tiles, n_items, p_w=packed.values, p_w32=packed.values.view(torch.int32),
                        p_s=packed.scales, p_s32=packed.scales.view(torch.int32), p_x=x, p_out=out, n_items=n_items,
                        n_blk=n_blk, K64=packed.k64, BN=tiles.bn, BK=tiles.bk, MODE=mode, FOLD=packed.fold,
                        EMULATE=interpreted(), WHOLE=whole)
        run()
        if whole:
            rows.append(dict(mode=name, out=out))
            continue
        torch.cuda.synchronize()
        us = median_graph_ms(run) * 1e3
        gbps = packed.nbytes / (us * 1e-6) / 1e9
        rows.append(dict(mode=name, tiles=tiles.short(), us=us, gbps=gbps, frac_copy=gbps / copy_gbps,
                         bytes=packed.nbytes))
    return rows


# (bk, stages, programs an SM, register cap) for the mma mode beyond the kernel's own tiling
VARIANTS = [(128, 5, 4, None), (128, 6, 4, None), (256, 3, 4, None), (128, 4, 4, 128),
            (128, 6, 4, 128), (256, 4, 4, 128)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", default="tp4,dp-ep")
    ap.add_argument("--ctas", default="3,4")
    ap.add_argument("--variants", action="store_true", help="also the mma mode at deeper pipelines and register caps")
    ap.add_argument("--json")
    args = ap.parse_args()
    copy = copy_bandwidth_gbps()
    print(f"copy bandwidth {copy:.0f} GB/s")
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for name in args.layout.split(","):
        w13, w2 = bench.layout_weights(bench.LAYOUTS[name], gen)
        packed = packed_experts(w13)
        runs = [(GemmTiles(bn=64, bk=128, warps=4, stages=4, ctas=c), MODES) for c in map(int, args.ctas.split(","))]
        if args.variants:
            runs += [(GemmTiles(bn=64, bk=bk, warps=4, stages=st, ctas=c, maxnreg=r), ("mma",)) for bk, st, c, r in VARIANTS]
        for tiles, modes in runs:
            for r in stream_rates(packed, copy, tiles, modes):
                r["layout"] = name
                rows.append(r)
                print(f"{name:5} {r['tiles']:18} {r['mode']:6} {r['us']:9.1f} µs  {r['gbps']:7.0f} GB/s  "
                      f"{r['frac_copy']:6.1%} of copy  ({r['bytes'] / 1e6:.0f} MB)", flush=True)
        del w13, w2, packed
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_gbps": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
