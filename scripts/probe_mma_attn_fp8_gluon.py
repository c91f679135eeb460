"""The FP8 Gluon main loop (kernel_gluon_fp8.py) on a Hopper GPU: correctness first, then timing.

    PYTHONPATH=. python3 scripts/probe_mma_attn_fp8_gluon.py --json $OUT/fp8_gluon.json

1. Correctness: the loop's partials merged by kernel.py's combine (mma_attention with the FP8
   Gluon loop switched on and the whole-width 64-row tiles at every B), against the float64
   reference over B {1, 3, 32, 64} x top-k {1, 100, 512, 640} (+ the 128-slot window) x
   {all slots used, half -1, one request with no used slot, contexts shorter than K}, window-only
   rows, and the compressed cache lying below the window cache in memory; bf16, outputs
   NaN-poisoned, relative error bound 1e-2 (the gate's). One line a case; FAIL lines say which
   output, the error, the worst element and the non-finite count.
2. Timing, only if every case passed: B {1, 16, 32, 64}, K 512 + window 128, FP8 layout,
   CUDA-graph medians over rotating input sets (bench.py's helpers): the production path as
   dispatched today, the FP8 Gluon loop + combine, and the loop alone.

Diagnostic only: the committed figures come from `dsv4opt bench mma-attn`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsv4opt.numerics import error_report, nan_poisoned_allocations  # noqa: E402
from dsv4opt.optimizations.mma_attn import bench as B  # noqa: E402
from dsv4opt.optimizations.mma_attn import kernel  # noqa: E402
from dsv4opt.optimizations.mma_attn.cases import PATTERNS, AttnCase, AttnInputs, make_inputs  # noqa: E402
from dsv4opt.optimizations.mma_attn.check import REL_TOL  # noqa: E402
from dsv4opt.workload.attention import sparse_attention_ref  # noqa: E402
from dsv4opt.workload.kvcache import KVCache  # noqa: E402

GATE_B = (1, 3, 32, 64)
GATE_TOPK = (1, 100, 512, 640)


@contextlib.contextmanager
def fp8_gluon(on: bool):
    """The dispatch's switch, set for the calls inside (read when a call plans, so also during a
    graph capture)."""
    before = kernel.GLUON_FP8_ENABLED
    kernel.GLUON_FP8_ENABLED = on
    try:
        yield
    finally:
        kernel.GLUON_FP8_ENABLED = before


def loop_tiles(batch: int, slots: int) -> kernel.Tiles:
    """The whole-width 64-row family (the one the loop implements) at every B, with the dispatch's
    split count; at B <= 4, where the dispatch takes value-split tiles, about one program per SM."""
    t = kernel.choose_tiles(batch, B.HEADS, slots, torch.device("cuda"), B.DIM, fp8=True)
    if t.block_v or t.block_k != 64 or t.num_warps != 8:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        t = replace(t, block_k=64, num_warps=8, num_stages=2, block_v=0, reload_v=False,
                    nsplit=min(round(sms / batch), triton.cdiv(slots, 64)))
    return replace(t, nsplit=max(2, t.nsplit))


def gluon_call(*args, tiles: kernel.Tiles):
    """mma_attention with the FP8 Gluon loop; refuses to run anything else under its name."""
    with fp8_gluon(True):
        q, swa, swa_idx, _, extra, idx = args[:6]
        engine = kernel.plan(q, swa, swa_idx, extra, idx, tiles).engine
        if engine != "gluon-fp8":
            raise RuntimeError(f"the dispatch took {engine!r}, not the FP8 Gluon loop (Hopper and Triton 3.6 needed)")
        return kernel.mma_attention(*args, tiles=tiles)


def below(x: AttnInputs) -> AttnInputs:
    """The same inputs with the compressed cache's bytes placed below the window cache's in one
    buffer (a negative offset between them), both 16-byte aligned."""
    a, b = x.extra.data.reshape(-1), x.swa.data.reshape(-1)
    gap = 4096
    buf = torch.zeros(a.numel() + gap + b.numel(), dtype=torch.uint8, device=a.device)
    buf[: a.numel()] = a
    buf[a.numel() + gap:] = b
    extra = KVCache(x.extra.layout, buf[: a.numel()].view(x.extra.data.shape))
    swa = KVCache(x.swa.layout, buf[a.numel() + gap:].view(x.swa.data.shape))
    return replace(x, swa=swa, extra=extra)


def gate_cases() -> list[tuple[str, AttnCase, bool]]:
    cases = [(AttnCase(b, k, p).name, AttnCase(b, k, p), False) for b in GATE_B for k in GATE_TOPK for p in PATTERNS]
    cases += [(AttnCase(b, 0, p).name, AttnCase(b, 0, p), False) for b in (1, 64) for p in ("all", "short")]
    cases += [(AttnCase(b, 512, "half_unused").name + "-extra-below", AttnCase(b, 512, "half_unused"), True) for b in (3, 64)]
    return cases


def check_cases() -> tuple[list[dict], bool]:
    rows, ok = [], True
    for i, (name, case, swap) in enumerate(gate_cases()):
        x = make_inputs(case, "cuda", torch.bfloat16, seed=i)
        if swap:
            x = below(x)
        tiles = loop_tiles(case.batch, case.window + case.topk)
        row = {"case": name, "passed": False}
        try:
            with nan_poisoned_allocations():
                o, lse = gluon_call(*x.args(), tiles=tiles)
            torch.cuda.synchronize()
            ref_o, ref_lse = sparse_attention_ref(*x.args())
            eo, el = error_report(o, ref_o), error_report(lse, ref_lse)
            p = kernel.plan(x.q, x.swa, x.swa_indices, x.extra, x.extra_indices, tiles)
            row.update(rel_err_o=eo.rel, max_abs_o=eo.max_abs, worst_o=list(eo.worst_index), nonfinite_o=eo.nonfinite,
                       rel_err_lse=el.rel, nonfinite_lse=el.nonfinite, chunk=p.chunk, nsplit=p.nsplit,
                       passed=eo.ok(REL_TOL) and el.ok(REL_TOL))
            line = f"o {eo.rel:.2e}  lse {el.rel:.2e}  chunk {p.chunk} x {p.nsplit}"
            if not row["passed"]:
                line += f"  | o: {eo}  | lse: {el}"
        except Exception as exc:  # a compile error or a fault is a failed case, reported in one line
            row["error"] = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            line = f"ERROR {row['error']}"
        rows.append(row)
        ok &= row["passed"]
        print(f"{'pass' if row['passed'] else 'FAIL'}  {name:42s} {line}", flush=True)
        if "error" in row and ("CUDA" in row["error"] or "illegal" in row["error"]):
            print("stopping the table: a CUDA error leaves the context unusable", flush=True)
            break
    return rows, ok


def partials_only(tiles: kernel.Tiles, sets: list[tuple], swa, extra, scale: float):
    """The loop alone (no combine), on preallocated partials, cycling through the sets."""
    from dsv4opt.optimizations.mma_attn.kernel_gluon_fp8 import gluon_fp8_sparse_decode_partials

    q, swa_idx, _, idx = sets[0][:4]
    p = kernel.plan(q, swa, swa_idx, extra, idx, tiles)
    o_part = torch.empty(q.shape[0], p.nsplit, q.shape[1], q.shape[2], device="cuda", dtype=torch.float32)
    lse_part = torch.empty(q.shape[0], p.nsplit, q.shape[1], device="cuda", dtype=torch.float32)

    def fn(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale):
        gluon_fp8_sparse_decode_partials(q, swa, swa_idx, swa_len, extra, idx, lengths, o_part, lse_part,
                                         p.chunk, p.nsplit, scale)

    return B.rotating(fn, swa, extra, sets, scale)


def time_batches(batches: list[int], copy_gbps: float, tflops: float) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    layout = B._layout("fp8", B.EXTRA_PAGE)
    pages = int(B.POOL_GB * 2**30) // (layout.token_bytes * B.EXTRA_PAGE)
    extra = KVCache.allocate(layout, pages, torch.bfloat16, "cuda")
    extra.fill_random(gen)
    scale = B.DIM**-0.5
    slots = B.TOPK + B.WINDOW
    rows = []
    for batch in batches:
        swa = KVCache.allocate(B._layout("fp8", B.WINDOW_PAGE), batch, torch.bfloat16, "cuda")
        swa.fill_random(gen)
        sets = B.input_sets(batch, swa, extra, gen)  # synchronises after creating the inputs
        q, swa_idx, swa_len, idx, lengths, sink = sets[0]
        x = (q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale)
        tiles = loop_tiles(batch, slots)
        with fp8_gluon(False):
            prod_plan = kernel.plan(q, swa, swa_idx, extra, idx)
        ref_o, ref_lse = sparse_attention_ref(*x)
        o, lse = gluon_call(*x, tiles=tiles)
        err = max(error_report(o, ref_o).rel, error_report(lse, ref_lse).rel)
        with fp8_gluon(False):
            prod_us = B._median_graph_ms(B.rotating(kernel.mma_attention, swa, extra, sets, scale)) * 1e3
        if err <= REL_TOL:
            loop_us = B._median_graph_ms(B.rotating(lambda *a: gluon_call(*a, tiles=tiles), swa, extra, sets, scale)) * 1e3
            alone_us = B._median_graph_ms(partials_only(tiles, sets, swa, extra, scale)) * 1e3
        else:
            loop_us = alone_us = float("nan")
        unique = int(torch.unique(swa_idx).numel()) + int(torch.unique(idx).numel())
        moved = unique * layout.token_bytes + 2 * q.numel() * q.element_size()
        floor_us = max(moved / (copy_gbps * 1e9), 2 * 2 * batch * B.HEADS * slots * B.DIM / (tflops * 1e12)) * 1e6
        p = kernel.plan(q, swa, swa_idx, extra, idx, tiles)
        row = {"batch": batch, "production_engine": prod_plan.engine, "production_tiles": str(prod_plan.tiles),
               "production_us": prod_us, "gluon_fp8_us": loop_us, "gluon_fp8_loop_alone_us": alone_us,
               "gluon_chunk": p.chunk, "gluon_nsplit": p.nsplit, "rel_err": err, "floor_us": floor_us,
               "input_sets": len(sets)}
        rows.append(row)
        roof = lambda us: f"{floor_us / us:6.1%}" if us == us else "   -  "  # noqa: E731
        speed = f"{prod_us / loop_us:5.2f}x" if loop_us == loop_us else "  -  "
        print(f"B {batch:3d}  production {prod_us:7.1f} us ({roof(prod_us)}, {prod_plan.engine})  FP8 Gluon "
              f"{loop_us:7.1f} us ({roof(loop_us)}; loop alone {alone_us:6.1f})  {speed}  err {err:.1e}  "
              f"chunk {p.chunk} x {p.nsplit}  sets {len(sets)}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--batch", default="1,16,32,64")
    ap.add_argument("--skip-check", action="store_true", help="time without the table (a failed loop is still not timed)")
    args = ap.parse_args()
    t0 = time.time()
    out = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
           "gluon_available": kernel.gluon_available(), "rel_tol": REL_TOL}
    print(f"{out['device']}, Triton {out['triton']}, torch {out['torch']}; Gluon available: {out['gluon_available']}",
          flush=True)
    ok = True
    if not args.skip_check:
        cases, ok = check_cases()
        passed = sum(r["passed"] for r in cases)
        worst = max(cases, key=lambda r: max(r.get("rel_err_o", float("inf")), r.get("rel_err_lse", float("inf"))))
        out["check"] = {"passed": passed, "total": len(gate_cases()), "cases": cases, "worst_case": worst["case"]}
        print(f"correctness: {passed}/{len(gate_cases())} cases within rel {REL_TOL:g}; worst {worst['case']} "
              f"(o {worst.get('rel_err_o', float('nan')):.2e}, lse {worst.get('rel_err_lse', float('nan')):.2e}) "
              f"[{time.time() - t0:.0f} s]", flush=True)
    if ok:
        copy_gbps, tflops = B.copy_bandwidth_gbps(), B.matmul_tflops()
        out.update(copy_gbps=copy_gbps, matmul_tflops=tflops)
        print(f"copy {copy_gbps:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s; K {B.TOPK} + window {B.WINDOW}, FP8 KV; "
              "(x%) = of the roofline", flush=True)
        out["timing"] = time_batches([int(b) for b in args.batch.split(",")], copy_gbps, tflops)
    else:
        print("FP8 Gluon loop FAILED the correctness table: not timed, no speed-up reported", flush=True)
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
