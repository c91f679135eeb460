"""A ceiling probe for a warp-specialised grouped-moe gate/up weight stream (Triton 3.6 Gluon, sm_90a).

    PYTHONPATH=. python3 benchmarks/probe_grouped_moe_ws.py [--layout tp4,dp-ep] [--stages 4,6] [--consumers 1,2]
        [--producers 1] [--ctas 2] [--inflight 0,1] [--json OUT] [--check] [--compile-only]

The question: `probe_grouped_moe_ceiling.py`'s `mma` mode, where every warp issues the loads,
decodes and runs the MMA, streams at ~63% of the H200's copy bandwidth, issue-bound. Does a
warp-specialised stream get closer? The same work per byte as that mode (items of 64 gate + the
same 64 up rows of an expert, as `_up_step` stacks them, every K step of 128 columns = 16 units,
8 KB values + 512 B scales, in turn; persistent), split in two partitions:
- producer (1 or 4 warps, PREGS registers): cp.async of each step's units into a shared ring and a
  cp.async.mbarrier.arrive.noinc on `full` (it never waits on its copies), after waiting `empty`;
- consumers (1 or 2 warpgroups, the default partition): wait `full`, load a lane's 16 value bytes
  and scale word from shared memory, decode them with the production decode's shifts, masks and
  bf16x2 multiplies (one inline PTX block a lane and unit, the scale folded) straight into the
  wgmma A registers (no layout conversion: asserted), wgmma against a fixed [128, 16] bf16 token
  tile in shared memory, release the slot. Each item's accumulator sum goes to out[item].

--compile-only (no GPU): each variant compiled for sm_90a: ptxas registers and spills, setmaxnreg
per partition, shared memory, what the PTX holds and the SASS instructions a K step of the
consumer's and the producer's loops. --check (GPU): every item's sum against the MXFP4 weights
dequantised in torch, so no timing comes from a kernel that skips work (exit status 1 if one
differs). Otherwise µs, GB/s and the fraction of copy bandwidth per variant (CUDA-graph medians).
tests/optimizations/test_grouped_moe_ws_probe.py checks the PTX and the register permutation on the CPU.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)

from dsv4opt.sass import listing, ptxas_log, tightest_loop  # noqa: E402
from dsv4opt.workload.kernels.grouped_moe.ws import decode_asm  # noqa: E402

BN, BK = gl.constexpr(64), gl.constexpr(128)
UNITS = gl.constexpr(2 * BN // 16 * (BK // 64))  # 16 units a K step, unit index kb * 8 + stacked row unit


# the production decode, one copy (the gate/up kernel's): checked on the CPU by
# tests/optimizations/test_grouped_moe_ws_probe.py, on the H200 by --check
DECODE_ASM = gl.constexpr(decode_asm())


@gluon.jit
def _decode(b_v, b_s, CW: gl.constexpr):
    """b_v [16 units, 8 g, 4 q, 4 s, 4 b] u8 (a lane's 16 bytes), b_s [16, 8, 1, 1, 4] u8 (its scale
    word) -> the [128, 128] bf16 A tile in the wgmma register layout (asserted a free conversion)."""
    r0, r1 = gl.inline_asm_elementwise(DECODE_ASM, "=r," * 16 + "r,r,r,r,r,r,r,r", [b_v, b_s],
                                       dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=16)
    b_t = gl.reshape(gl.join(r0, r1), [2, 8, 8, 4, 4, 2, 2, 2])  # kb, row unit, g, q, s, ih, h, w
    # row = unit * 16 + ih * 8 + g; column = kb * 64 + s * 16 + w * 8 + q * 2 + h
    b_t = gl.reshape(gl.permute(b_t, (1, 5, 2, 0, 4, 7, 3, 6)), [2 * BN, BK])
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * CW, 1], instr_shape=[16, 16, 16])
    return gl.convert_layout(b_t, gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2), assert_trivial=True)


@gluon.jit
def _step(vals, scs, x_smem, full, empty, acc, t, STAGES: gl.constexpr, CW: gl.constexpr, INFLIGHT: gl.constexpr):
    """K step t: wait `full`, read the slot's units, decode, issue the wgmma, release the slot, and
    retire all wgmma but INFLIGHT."""
    lv: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4, 4], [1, 8, 4, 1, 1], [4 * CW, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    slot = t % STAGES
    mbarrier.wait(full.index(slot), (t // STAGES) & 1)
    b_v = vals.index(slot).reshape([UNITS, 8, 4, 4, 4]).load(lv)  # warp w: row units w (+ 4 with 4 warps)
    b_s = scs.index(slot).reshape([UNITS, 8, 4]).load(gl.SliceLayout(2, gl.SliceLayout(3, lv)))  # one word a g
    b_a = _decode(b_v, gl.expand_dims(gl.expand_dims(b_s, 2), 3), CW)
    acc = warpgroup_mma(b_a, x_smem, acc, is_async=True)
    mbarrier.arrive(empty.index(slot))  # after the issue: before it, membar adds a partition barrier
    return warpgroup_mma_wait(INFLIGHT, deps=[acc])


@gluon.jit
def _consumer(vals, scs, x_smem, full, empty, p_out, num_progs, n_items, K64, STAGES: gl.constexpr, CW: gl.constexpr,
              INFLIGHT: gl.constexpr):
    """Every item's K steps, then its sum to p_out. INFLIGHT: one wgmma stays in flight while the
    next step decodes. A wgmma reads its register A operand asynchronously, so the next decode must
    not land in it: two steps an iteration give the two A tiles PTX registers of their own (a
    one-step loop redefines the in-flight wgmma's registers, and --check failed)."""
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * CW, 1], instr_shape=[16, 16, 16])
    t = 0
    for w in range(gl.program_id(0), n_items, num_progs):
        acc = gl.zeros([2 * BN, 16], gl.float32, acc_l)
        for i in range(0, K64 // 2, 1 + INFLIGHT):
            acc = _step(vals, scs, x_smem, full, empty, acc, t, STAGES, CW, INFLIGHT)
            if INFLIGHT:
                acc = _step(vals, scs, x_smem, full, empty, acc, t + 1, STAGES, CW, INFLIGHT)
            t += 1 + INFLIGHT
        acc = warpgroup_mma_wait(0, deps=[acc])
        gl.store(p_out + w, gl.sum(gl.sum(acc, 1), 0))


@gluon.jit
def _units(o_u, e, n0, i, I, N16, K64):
    """Unit indices of K step i's units o_u (kb * 8 + stacked row unit: 4 gate, then 4 up)."""
    row = e * N16 + gl.where(o_u % 8 < 4, n0 // 16, (I + n0) // 16) + o_u % 4
    return row.to(gl.int64) * K64 + 2 * i + o_u // 8


@gluon.jit
def _producer(p_w, p_s, vals, scs, full, empty, num_progs, n_items, n_blk, I, N16, K64,
              STAGES: gl.constexpr, PW: gl.constexpr):
    """Per item and K step: wait `empty`, cp.async the 16 value units (512 B each) and their scales (32 B each)
    into the slot, then an arrive on `full` that lands when this thread's copies have (noinc)."""
    lp: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [PW, 1], [1, 0])
    if PW == 1:
        lq: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [1, 1], [1, 0])  # one 16-byte copy a lane
    else:
        lq: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [PW, 1], [1, 0])
    o_u = gl.arange(0, UNITS, layout=gl.SliceLayout(1, lp))
    o_b = gl.arange(0, 512, layout=gl.SliceLayout(0, lp))
    o_uq = gl.arange(0, UNITS, layout=gl.SliceLayout(1, lq))
    o_bq = gl.arange(0, 32, layout=gl.SliceLayout(0, lq))
    t = 0
    for w in range(gl.program_id(0), n_items, num_progs):
        e = w // n_blk
        n0 = (w % n_blk) * BN
        for i in range(K64 // 2):
            slot = t % STAGES
            mbarrier.wait(empty.index(slot), ((t // STAGES) & 1) ^ 1)  # the first pass finds it free
            unit = _units(o_u, e, n0, i, I, N16, K64)
            cp.async_copy_global_to_shared(vals.index(slot), p_w + unit[:, None] * 512 + o_b[None, :])
            unit = _units(o_uq, e, n0, i, I, N16, K64)
            cp.async_copy_global_to_shared(scs.index(slot), p_s + unit[:, None] * 32 + o_bq[None, :])
            cp.mbarrier_arrive(full.index(slot), increment_count=False)
            t += 1


@gluon.jit
def ws_kernel(p_w, p_s, p_x, p_out, num_progs, n_items, n_blk, I, N16, K64,
              STAGES: gl.constexpr, CW: gl.constexpr, PW: gl.constexpr, PREGS: gl.constexpr,
              INFLIGHT: gl.constexpr):
    """The token tile into shared memory, the ring and its barriers, then the two partitions."""
    lx: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4 * CW, 1], [1, 0])
    o_k = gl.arange(0, BK, layout=gl.SliceLayout(1, lx))
    o_n = gl.arange(0, 16, layout=gl.SliceLayout(0, lx))
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [BK, 16], gl.NVMMASharedLayout.get_default_for([BK, 16], gl.bfloat16),
                                       gl.load(p_x + o_k[:, None] * 16 + o_n[None, :]))
    flat: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])  # a slot's rank
    vals = gl.allocate_shared_memory(gl.uint8, [STAGES, UNITS, 512], flat)
    scs = gl.allocate_shared_memory(gl.uint8, [STAGES, UNITS, 32], flat)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(full.index(s), count=32 * PW)  # every producer thread's noinc arrive
        mbarrier.init(empty.index(s), count=1)  # Gluon's arrive: a partition barrier, then one thread
    fence_async_shared()  # the token tile and the barriers before the async proxy (wgmma) sees them
    gl.warp_specialize([(_consumer, (vals, scs, x_smem, full, empty, p_out, num_progs, n_items, K64, STAGES, CW, INFLIGHT)),
                        (_producer, (p_w, p_s, vals, scs, full, empty, num_progs, n_items, n_blk, I, N16, K64,
                                     STAGES, PW))], [PW], [PREGS])


PREGS = 40  # the producer partition's registers (setmaxnreg); its warps pad to a warpgroup
PTX_COUNTS = {"wgmma": r"wgmma\.mma_async", "mbarrier": r"mbarrier\.", "cp_async": r"cp\.async\.c[ag]\.shared\.global",
              "st_shared": r"\bst\.shared", "ld_shared": r"\bld\.shared", "bar_sync": r"\bbar\.sync",
              "mul_bf16x2": r"mul\.rn\.bf16x2"}


def variants(args) -> list[tuple[int, int, int, int, int]]:
    """(stages, consumer warpgroups, producer warps, programs an SM, wgmma in flight) for every combination asked."""
    return list(itertools.product(*(map(int, getattr(args, k).split(",")) for k in
                                    ("stages", "consumers", "producers", "ctas", "inflight"))))


def _name(v) -> str:
    return "ws s{} c{} p{} x{} f{}".format(*v)


def _launch_opts(v) -> dict:
    """num_warps (the consumers) and the register cap that lets `ctas` programs share an SM: Triton pads
    the producer to a warpgroup, so a program holds 4 * (consumers + 1) warps, and the cap is the SM's
    registers shared evenly among them; setmaxnreg then moves registers from the producer (PREGS) to
    the consumers within that budget."""
    _, cw, _, ctas, _ = v
    regs = 65536 // (ctas * 32 * 4 * (cw + 1)) // 8 * 8
    return {"num_warps": 4 * cw} | ({"maxnreg": regs} if regs < 256 else {})


def compile_report(v) -> dict:
    """Compile variant v for sm_90a (no GPU) and read ptxas, the PTX and the two partitions' SASS loops."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    stages, cw, pw, _, inflight = v
    sig = dict(p_w="*u8", p_s="*u8", p_x="*bf16", p_out="*fp32", **{k: "i32" for k in
               ("num_progs", "n_items", "n_blk", "I", "N16", "K64")})
    const = dict(STAGES=stages, CW=cw, PW=pw, PREGS=PREGS, INFLIGHT=inflight)
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 7, 8, 9)}
    c = triton.compile(GluonASTSource(ws_kernel, {**sig, **{k: "constexpr" for k in const}}, const, attrs),
                       target=GPUTarget("cuda", 90, 32), options=_launch_opts(v))
    ptx = c.asm["ptx"]
    log = ptxas_log(ptx)
    nreg = [int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)]
    # setmaxnreg in PTX order: the default partition's before the region, then inside it (the consumer)
    row = dict(variant=_name(v), warps=c.metadata.num_warps, launch_regs=int(re.search(r"Used (\d+) registers", log).group(1)),
               consumer_regs=nreg[1], producer_regs=PREGS if PREGS in nreg else None,
               spill_bytes="/".join(re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups()),
               shared_bytes=c.metadata.shared, wgmma_serialized="C7512" in log)  # ptxas: a wait after every wgmma
    row |= {k: len(re.findall(p, ptx)) for k, p in PTX_COUNTS.items()}
    sass = listing(c)
    for part, op, steps in (("consumer", "HGMMA", 1 + inflight), ("producer", "LDGSTS", 1)):
        ops = tightest_loop(sass, op)  # the consumer's loop holds 1 + INFLIGHT K steps
        if ops:
            row[f"{part}_loop"] = dict(per_step=sum(ops.values()) / steps, ops=dict(ops.most_common(12)))
    return row


def launch(packed, x, out, v, I: int) -> None:
    import torch
    stages, cw, pw, ctas, inflight = v
    n_blk = I // BN
    n_items = packed.experts * n_blk
    progs = min(n_items, ctas * torch.cuda.get_device_properties(x.device).multi_processor_count)
    ws_kernel[(progs,)](packed.values, packed.scales, x, out, progs, n_items, n_blk, I, packed.n16, packed.k64,
                        STAGES=stages, CW=cw, PW=pw, PREGS=PREGS, INFLIGHT=inflight, **_launch_opts(v))


def reference(w13, x, I: int):
    """Each item's sum in float64: the dequantised weights times the token tile repeated along K."""
    import torch
    from dsv4opt.workload.quant import dequantize_mxfp4
    xs = x.double().sum(1)  # [BK]: the tile's tokens summed (the item sum is linear in them)
    sums, mags = [], []
    for e in range(0, w13.packed.shape[0], 8):
        wt = dequantize_mxfp4(w13.packed[e:e + 8], w13.scales[e:e + 8])  # [r, 2I, K] float64
        wt = wt.view(*wt.shape[:2], -1, BK)
        y = (wt * xs).sum((2, 3)).view(-1, 2, I // BN, BN)
        sums.append(y.sum((1, 3)).flatten())
        mags.append((wt.abs() * xs.abs()).sum((2, 3)).view(-1, 2, I // BN, BN).sum((1, 3)).flatten())
    return torch.cat(sums), torch.cat(mags)


def run_gpu(args) -> list[dict]:
    import torch
    from dsv4opt.optimizations.grouped_moe import bench
    from dsv4opt.optimizations.timing import copy_bandwidth_gbps, median_graph_ms
    from dsv4opt.workload.kernels.grouped_moe.layout import packed_experts

    copy = copy_bandwidth_gbps()
    print(f"copy bandwidth {copy:.0f} GB/s")
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for name in args.layout.split(","):
        w13, w2 = bench.layout_weights(bench.LAYOUTS[name], gen)
        packed = packed_experts(w13)
        # 2 units a K step; with a wgmma in flight the consumer takes two steps an iteration, so the steps
        # must be even there too (an odd count would wait on a barrier the producer never fills)
        assert packed.fold and packed.k64 % 4 == 0, "the probe folds the scale and takes 2 or 4 units an iteration"
        I = packed.rows // 2
        x = torch.randn(BK, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(1)).to(torch.bfloat16)
        ref = reference(w13, x, I) if args.check else None
        for v in variants(args):
            out = torch.full((packed.experts * (I // BN),), float("nan"), device="cuda")
            run = functools.partial(launch, packed, x, out, v, I)
            run()
            torch.cuda.synchronize()
            r = dict(layout=name, variant=_name(v), bytes=packed.nbytes)
            if ref is not None:
                err = (out.double() - ref[0]).abs()
                # an item's sum is ~1/700 of its sum of |w x| (128 x 4096 signed terms): a tolerance of
                # 1e-5 of the latter is ~1% of the former, so a skipped step or a wrong scale shows
                r["check_ok"] = bool((err <= 1e-5 * ref[1]).all())
                r["check_max_rel"] = float((err / (ref[1] + 1e-6)).max())
            us = median_graph_ms(run) * 1e3
            r |= dict(us=us, gbps=packed.nbytes / (us * 1e-6) / 1e9)
            r["frac_copy"] = r["gbps"] / copy
            rows.append(r)
            chk = f"  check {'ok' if r['check_ok'] else 'FAILED'} (max rel {r['check_max_rel']:.1e})" if ref is not None else ""
            print(f"{name:5} {r['variant']:20} {us:9.1f} µs  {r['gbps']:7.0f} GB/s  "
                  f"{r['frac_copy']:6.1%} of copy  ({packed.nbytes / 1e6:.0f} MB){chk}", flush=True)
        del w13, w2, packed
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", default="tp4,dp-ep")
    ap.add_argument("--stages", default="4,6")
    ap.add_argument("--consumers", default="1,2", help="consumer warpgroups (the default partition)")
    ap.add_argument("--producers", default="1", help="producer warps")
    ap.add_argument("--ctas", default="2", help="persistent programs an SM (sets the register cap)")
    ap.add_argument("--inflight", default="0,1", help="wgmma left in flight while the next step decodes")
    ap.add_argument("--check", action="store_true", help="compare every item's sum with a torch reference")
    ap.add_argument("--compile-only", action="store_true", help="sm_90a compile figures, no GPU")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.compile_only:
        rows = []
        for v in variants(args):
            rows.append(compile_report(v))
            print("  ".join(f"{k} {val}" for k, val in rows[-1].items() if not k.endswith("_loop")), flush=True)
            for part in ("consumer", "producer"):
                lp = rows[-1].get(f"{part}_loop")
                print(f"    {part} K loop: {lp['per_step']:.0f} SASS instructions a step: {lp['ops']}" if lp else
                      f"    {part} K loop: not found in the SASS", flush=True)
    else:
        rows = run_gpu(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if any(r.get("check_ok") is False for r in rows):
        sys.exit("a variant's item sums differ from the reference")


if __name__ == "__main__":
    main()
