"""FlashMLA's Hopper sparse FP8 decode at DeepSeek-V4-Flash's shape, beside mma-attn, in one run.

Issue 13 names FlashMLA's sparse decode as the anchor to beat. Its Hopper kernel reads the MODEL1
FP8 layout, which is byte for byte the layout `dsv4opt/workload/kvcache.py` stores (SGLang's), and
has a 64-head instance with a second ("extra") cache, so it runs on the very inputs of `dsv4opt
bench mma-attn --kv fp8`: the window cache as its main cache, the compressed cache as the extra one,
the same rotating input sets over the same 4 GB pool, the same CUDA-graph medians.

    FLASHMLA=... CUTLASS=... bash benchmarks/anchor_flashmla/build.sh        # here: nvcc, no GPU
    PYTHONPATH=. python3 benchmarks/bench_flashmla_anchor.py --json OUT.json  # on the H200

The library is FlashMLA's own decode kernel, scheduler and combine behind benchmarks/anchor_flashmla/
shim.cu. Its scheduler metadata is computed once per input set, outside the timed calls, as
FlashMLA's interface expects (once per decoding step, shared by the layers). Both kernels are
checked against a float64 reference on the first input set of each batch before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsv4opt.optimizations.mma_attn import bench  # noqa: E402
from dsv4opt.optimizations.mma_attn.anchor import FlashMLA, load  # noqa: E402

TOL = 1e-2  # relative, as the mma-attn gate in bf16


def reference(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale):
    """The project's float64 reference (`sparse_attention_ref`) in FlashMLA's convention: o with the
    sink, lse without it (the same attention with no sink)."""
    from dsv4opt.workload.attention.naive import sparse_attention_ref

    o, _ = sparse_attention_ref(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale)
    no_sink = torch.full_like(sink, float("-inf"))
    _, lse = sparse_attention_ref(q, swa, swa_idx, swa_len, extra, idx, lengths, no_sink, scale)
    return o, lse


def rel_err(got, want) -> float:
    """Largest absolute error over the largest reference magnitude; a non-finite value is infinite."""
    got, want = got.double().cpu(), want.double().cpu()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=str(ROOT / ".anchor" / "libflashmla_anchor.so"))
    ap.add_argument("--batch", default="1,16,32,64")
    ap.add_argument("--pool-gb", type=float, default=bench.POOL_GB)
    ap.add_argument("--heads", type=int, default=bench.HEADS, choices=(64, 128),
                    help="query heads; at 128 (DeepSeek-V3.2's count, the shape FlashMLA's published figure "
                         "comes from) only FlashMLA runs: mma-attn is built for DeepSeek-V4-Flash's 64")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    lib, why = load(Path(args.lib))
    if lib is None:
        raise SystemExit(why)
    from dsv4opt.numerics import nan_poisoned_allocations
    from dsv4opt.optimizations.mma_attn.kernel import mma_attention, plan

    copy_gbps, tflops = bench.copy_bandwidth_gbps(), bench.matmul_tflops()
    print(f"{torch.cuda.get_device_name()}: copy {copy_gbps:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    extra = bench.pool_cache("fp8", gen, args.pool_gb)
    layout = extra.layout
    scale = bench.DIM**-0.5
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        swa = bench.window_cache("fp8", batch, gen)
        sets = bench.input_sets(batch, swa, extra, gen)
        if args.heads != bench.HEADS:  # the same rows and indices, more query heads
            sets = [(torch.randn(batch, args.heads, bench.DIM, device="cuda", dtype=torch.bfloat16, generator=gen),
                     *s[1:5], torch.randn(args.heads, device="cuda", generator=gen)) for s in sets]
            torch.cuda.synchronize()
        mma = args.heads == bench.HEADS
        fm = FlashMLA(lib, batch, swa, extra, sets, scale)
        # Correctness on the first set, outputs NaN-poisoned first.
        o_ref, lse_ref = reference(sets[0][0], swa, *sets[0][1:3], extra, *sets[0][3:], scale)
        fm.out.fill_(float("nan"))
        fm.lse.fill_(float("nan"))
        o_fm, lse_fm = fm.call(0)
        torch.cuda.synchronize()
        err_fm = (rel_err(o_fm, o_ref), rel_err(lse_fm, lse_ref))
        err_mma = None
        if mma:  # mma-attn's lse includes the sink (the slot's contract): log(exp(lse) + exp(sink))
            with nan_poisoned_allocations():  # as the gate: an element it does not write stays NaN
                o_mma, lse_mma = mma_attention(sets[0][0], swa, *sets[0][1:3], extra, *sets[0][3:], scale)
                torch.cuda.synchronize()
            lse_ref_sink = torch.logaddexp(lse_ref, sets[0][5].double().cpu()[None, :])
            err_mma = (rel_err(o_mma, o_ref), rel_err(lse_mma, lse_ref_sink))
        ok = max(err_fm) <= TOL and (err_mma is None or max(err_mma) <= TOL)
        print(f"B = {batch}: {len(sets)} input sets; rel err FlashMLA o {err_fm[0]:.2e} lse {err_fm[1]:.2e}"
              + (f", mma-attn o {err_mma[0]:.2e} lse {err_mma[1]:.2e}" if mma else ""), flush=True)
        if not ok:
            print(f"B = {batch}: a kernel is off the float64 reference (tolerance {TOL}); not timed", flush=True)
            rows.append({"batch": batch, "check": False, "err_flashmla": err_fm, "err_mma": err_mma})
            continue
        fm_ms = bench.median_graph_ms(lambda: fm.call())
        q, swa_idx, _, idx = sets[0][:4]
        unique = int(torch.unique(swa_idx).numel()) + int(torch.unique(idx).numel())
        moved = unique * layout.token_bytes + 2 * q.numel() * q.element_size()
        flops = 2 * 2 * batch * args.heads * (bench.TOPK + bench.WINDOW) * bench.DIM
        roof_us = max(moved / (copy_gbps * 1e9), flops / (tflops * 1e12)) * 1e6
        row = {
            "batch": batch, "check": True, "input_sets": len(sets), "err_flashmla": err_fm,
            "flashmla_us": fm_ms * 1e3, "roofline_us": roof_us, "flashmla_of_roofline": roof_us / (fm_ms * 1e3),
        }
        line = f"B = {batch}: FlashMLA {row['flashmla_us']:.1f} µs ({row['flashmla_of_roofline']:.1%} of the roofline)"
        if mma:
            mma_ms = bench.median_graph_ms(bench.rotating(mma_attention, swa, extra, sets, scale))
            row |= {"err_mma": err_mma, "mma_attn_us": mma_ms * 1e3,
                    "mma_attn_loop": plan(q, swa, swa_idx, extra, idx).engine,
                    "mma_attn_of_roofline": roof_us / (mma_ms * 1e3), "mma_attn_x_flashmla": fm_ms / mma_ms}
            line += (f", mma-attn {row['mma_attn_us']:.1f} µs ({row['mma_attn_of_roofline']:.1%}); "
                     f"mma-attn {row['mma_attn_x_flashmla']:.2f}x FlashMLA")
        rows.append(row)
        print(line, flush=True)
    out = {"device": torch.cuda.get_device_name(), "commit": os.environ.get("DSV4OPT_COMMIT", "unknown"),
           "copy_gbps": copy_gbps, "matmul_tflops": tflops,
           "shape": {"heads": args.heads, "dim": bench.DIM, "topk": bench.TOPK, "window": bench.WINDOW, "kv": "fp8"},
           "flashmla": f"deepseek-ai/FlashMLA@9241ae3, sm90 sparse_fp8 MODEL1 h{args.heads} + combine", "rows": rows}
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.json)
    return 0 if all(r["check"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
