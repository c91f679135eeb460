"""The FP8 Gluon main loop (kernel_gluon_fp8.py) and its variants on a Hopper GPU: correctness
first, then timing.

    PYTHONPATH=. python3 scripts/probe_mma_attn_fp8_gluon.py --variants loop,merge --json $OUT/fp8_gluon.json

Variants (--variants, comma-separated; each is the dispatch's switches for the calls inside):
  loop       the loop writing partials, kernel.py's combine merging them (production 1fb1376 to
             3191c29); with --kv bf16, kernel_gluon.py once per cache
  merge      the loop merging the splits in each request's last program (GLUON_FP8_MERGE_IN_KERNEL)
  ws         the warp-specialised loop (kernel_gluon_fp8_ws.py, GLUON_FP8_WS; with --kv bf16
             kernel_gluon_bf16_ws.py, GLUON_BF16_WS), fp32 partials + the combine
  ws-staged  the same, the partials written through shared memory in whole lines
  ws-bf16    the same, bf16 partials
  ws-merge   ws-bf16 with the splits merged in each request's last program, its own split kept on
             chip (GLUON_WS_MERGE_IN_KERNEL), at every split count (the dispatch: up to
             WS_MERGE_MAX_SPLITS)
  ws@SUB:NST:REGS[:ABLATE]  kernel_gluon_fp8_ws's constants (also ws-staged@..., ws-bf16@...)
--kv bf16 runs the table and the timing on bf16 rows instead of the FP8 layout.

1. Correctness, per variant: mma_attention with the variant's switches on and the whole-width
   64-row tiles at every B, against the float64 reference over B {1, 3, 32, 64} x top-k {1, 100,
   512, 640} (+ the 128-slot window) x {all slots used, half -1, one request with no used slot,
   contexts shorter than K}, window-only rows, the compressed cache lying below the window
   cache in memory, and rows at SGLang's graph width (8192 slots, at most 128 used, holes, the
   last request with none; B 8 and 32: most of B = 8's 16 splits idle); bf16, outputs
   NaN-poisoned, relative error bound 1e-2 (the gate's). One line a case; FAIL lines say which
   output, the error, the worst element and the non-finite count. With merge and ws-merge, the
   per-request counts must be back at zero after the table.
2. Timing, only of the variants whose every case passed: B {1, 16, 32, 64}, K 512 + window 128,
   FP8 layout, CUDA-graph medians over rotating input sets (bench.py's helpers): the production
   path as dispatched today against each variant (loop: also the loop alone, without the combine);
   each variant checked again after its replays (merge, ws-merge: the counts survive graph replays).

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
from dsv4opt.optimizations.mma_attn.cases import GRAPH, PATTERNS, AttnCase, AttnInputs, make_inputs  # noqa: E402
from dsv4opt.optimizations.mma_attn.check import REL_TOL  # noqa: E402
from dsv4opt.workload.attention import sparse_attention_ref  # noqa: E402
from dsv4opt.workload.kvcache import KVCache  # noqa: E402

GATE_B = (1, 3, 32, 64)
GATE_TOPK = (1, 100, 512, 640)


# what each variant switches on in the dispatch (kernel.py's module switches)
_WS = {"GLUON_FP8_ENABLED": True, "GLUON_FP8_MERGE_IN_KERNEL": False, "GLUON_FP8_WS": True, "GLUON_BF16_WS": True,
       "GLUON_WS_MERGE_IN_KERNEL": False}
_PARTIALS = {"GLUON_WS_STAGED_STORE": False, "GLUON_WS_BF16_PARTIALS": False}
VARIANTS = {
    "loop": {"GLUON_FP8_ENABLED": True, "GLUON_FP8_MERGE_IN_KERNEL": False, "GLUON_FP8_WS": False,
             "GLUON_BF16_WS": False, **_PARTIALS},
    "merge": {"GLUON_FP8_ENABLED": True, "GLUON_FP8_MERGE_IN_KERNEL": True, "GLUON_FP8_WS": False, **_PARTIALS},
    "ws": {**_WS, **_PARTIALS},
    "ws-staged": {**_WS, "GLUON_WS_STAGED_STORE": True, "GLUON_WS_BF16_PARTIALS": False},
    "ws-bf16": {**_WS, "GLUON_WS_STAGED_STORE": True, "GLUON_WS_BF16_PARTIALS": True},
    "ws-merge": {**_WS, "GLUON_WS_STAGED_STORE": True, "GLUON_WS_BF16_PARTIALS": True, "GLUON_WS_MERGE_IN_KERNEL": True,
                 "WS_MERGE_MAX_SPLITS": 64},
}
# the engine each variant must get from the dispatch, per KV layout (bf16 rows: "loop" is
# kernel_gluon.py once per cache, and there is no in-kernel merge)
ENGINES = {
    "fp8": {"loop": "gluon-fp8", "merge": "gluon-fp8", "ws": "gluon-fp8-ws", "ws-staged": "gluon-fp8-ws",
            "ws-bf16": "gluon-fp8-ws", "ws-merge": "gluon-fp8-ws"},
    "bf16": {"loop": "gluon", "ws": "gluon-ws", "ws-staged": "gluon-ws", "ws-bf16": "gluon-ws", "ws-merge": "gluon-ws"},
}
KV = "fp8"  # --kv


@contextlib.contextmanager
def _patched(module, **values):
    """`module`'s globals set for the calls inside, the committed values back afterwards."""
    before = {k: getattr(module, k) for k in values}  # AttributeError for a misspelt name, not a new one
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            setattr(module, k, v)


def switches(**on: bool):
    """The dispatch's switches set for the calls inside (read when a call plans, so also during a
    graph capture); the committed values afterwards."""
    return _patched(kernel, **on)


def loop_tiles(batch: int, slots: int) -> kernel.Tiles:
    """The whole-width 64-row family (the one the loop implements) at every B, with the dispatch's
    split count; at B <= 4, where the dispatch takes value-split tiles, about one program per SM."""
    t = kernel.choose_tiles(batch, B.HEADS, slots, torch.device("cuda"), B.DIM, fp8=True)
    if t.block_v or t.block_k != 64 or t.num_warps != 8:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        t = replace(t, block_k=64, num_warps=8, num_stages=2, block_v=0, reload_v=False,
                    nsplit=min(round(sms / batch), triton.cdiv(slots, 64)))
    return replace(t, nsplit=max(2, t.nsplit))


@contextlib.contextmanager
def ws_config(variant: str):
    """"ws@SUB:NST:REGS[:ABLATE]" runs the warp-specialised loop with those sub-tile rows, staging
    buffers, producer registers and ablation (kernel_gluon_fp8_ws's constants; the bf16 loop reads
    REGS and ABLATE from there too, and has no sub-tiles or staging) for the calls inside; other
    names as they are."""
    from dsv4opt.optimizations.mma_attn import kernel_gluon_fp8_ws as g

    name, _, config = variant.partition("@")
    values = zip(("SUB", "NUM_STAGE", "PRODUCER_REGS", "ABLATE"), (int(v) for v in config.split(":") if v))
    with _patched(g, **dict(values)):
        yield name


def gluon_call(*args, tiles: kernel.Tiles, variant: str = "loop"):
    """mma_attention with `variant`'s switches; refuses to run anything else under its name."""
    with ws_config(variant) as variant, switches(**VARIANTS[variant]):
        q, swa, swa_idx, _, extra, idx = args[:6]
        p = kernel.plan(q, swa, swa_idx, extra, idx, tiles)
        if p.engine != ENGINES[KV].get(variant) or p.merge_in_kernel != merges(variant, p.nsplit):
            raise RuntimeError(f"the dispatch took {p.engine!r} (merge in kernel: {p.merge_in_kernel}), not "
                               f"variant {variant!r} (Hopper and Triton 3.6 needed)")
        return kernel.mma_attention(*args, tiles=tiles)


def merges(variant: str, nsplit: int) -> bool:
    """Whether `variant` merges `nsplit` splits in the loop's last program (no combine launch)."""
    on = VARIANTS[variant.split("@")[0]]
    if on["GLUON_FP8_MERGE_IN_KERNEL"]:
        return True
    with switches(**on):  # the dispatch's own rule, under the variant's switches
        return kernel.ws_merge(nsplit)


def counts_at_zero() -> bool:
    """The in-kernel merge left every cached per-request count at 0 (what the next launch needs)."""
    return all(int(c.count_nonzero()) == 0 for c in kernel._MERGE_COUNTS.values())


def below(x: AttnInputs) -> AttnInputs:
    """The same inputs with the compressed cache's bytes placed below the window cache's in one
    buffer (a negative offset between them), both 16-byte aligned."""
    a, b = x.extra.data.reshape(-1).view(torch.uint8), x.swa.data.reshape(-1).view(torch.uint8)
    gap = 4096
    buf = torch.zeros(a.numel() + gap + b.numel(), dtype=torch.uint8, device=a.device)
    buf[: a.numel()] = a
    buf[a.numel() + gap:] = b
    dt = x.swa.data.dtype
    extra = KVCache(x.extra.layout, buf[: a.numel()].view(dt).view(x.extra.data.shape))
    swa = KVCache(x.swa.layout, buf[a.numel() + gap:].view(dt).view(x.swa.data.shape))
    return replace(x, swa=swa, extra=extra)


def gate_cases() -> list[tuple[str, AttnCase, bool]]:
    case = lambda b, k, p: AttnCase(b, k, p, layout=KV)  # noqa: E731
    cases = [(case(b, k, p).name, case(b, k, p), False) for b in GATE_B for k in GATE_TOPK for p in PATTERNS]
    cases += [(case(b, 0, p).name, case(b, 0, p), False) for b in (1, 64) for p in ("all", "short")]
    cases += [(case(b, 512, "half_unused").name + "-extra-below", case(b, 512, "half_unused"), True) for b in (3, 64)]
    cases += [(case(b, 8192, GRAPH).name, case(b, 8192, GRAPH), False) for b in (8, 32)]
    return cases


def check_cases(variant: str) -> tuple[list[dict], bool]:
    rows, ok = [], True
    for i, (name, case, swap) in enumerate(gate_cases()):
        x = make_inputs(case, "cuda", torch.bfloat16, seed=i)
        if swap:
            x = below(x)
        tiles = loop_tiles(case.batch, case.window + case.topk)
        row = {"case": name, "passed": False}
        try:
            with nan_poisoned_allocations():
                o, lse = gluon_call(*x.args(), tiles=tiles, variant=variant)
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
        print(f"{variant:5s} {'pass' if row['passed'] else 'FAIL'}  {name:42s} {line}", flush=True)
        if "error" in row and ("CUDA" in row["error"] or "illegal" in row["error"]):
            print("stopping the table: a CUDA error leaves the context unusable", flush=True)
            break
    if merges(variant, 2):
        zero = counts_at_zero()
        rows.append({"case": "merge counts back at zero", "passed": zero})
        ok &= zero
        print(f"{variant:5s} {'pass' if zero else 'FAIL'}  per-request counts back at zero after the table", flush=True)
    return rows, ok


def partials_only(tiles: kernel.Tiles, sets: list[tuple], swa, extra, scale: float, variant: str = "loop"):
    """The loop alone (no combine), on preallocated partials, cycling through the sets."""
    from dsv4opt.optimizations.mma_attn.kernel_gluon_bf16_ws import gluon_bf16_ws_sparse_decode_partials
    from dsv4opt.optimizations.mma_attn.kernel_gluon_fp8 import gluon_fp8_sparse_decode_partials
    from dsv4opt.optimizations.mma_attn.kernel_gluon_fp8_ws import gluon_fp8_ws_sparse_decode_partials

    name = variant.split("@")[0]
    ws = name.startswith("ws")
    if KV == "bf16":
        launch = gluon_bf16_ws_sparse_decode_partials
    else:
        launch = gluon_fp8_ws_sparse_decode_partials if ws else gluon_fp8_sparse_decode_partials
    bf16_part = VARIANTS[name]["GLUON_WS_BF16_PARTIALS"]
    extra_args = {"staged": VARIANTS[name]["GLUON_WS_STAGED_STORE"] or bf16_part} if ws else {}  # as mma_attention
    part_dtype = torch.bfloat16 if bf16_part else torch.float32

    q, swa_idx, _, idx = sets[0][:4]
    with switches(**VARIANTS[name]):
        p = kernel.plan(q, swa, swa_idx, extra, idx, tiles)
    o_part = torch.empty(q.shape[0], p.nsplit, q.shape[1], q.shape[2], device="cuda", dtype=part_dtype)
    lse_part = torch.empty(q.shape[0], p.nsplit, q.shape[1], device="cuda", dtype=torch.float32)

    def fn(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale):
        with ws_config(variant):
            launch(q, swa, swa_idx, swa_len, extra, idx, lengths, o_part, lse_part, p.nsplit, scale, **extra_args)

    return B.rotating(fn, swa, extra, sets, scale)


def time_batches(batches: list[int], variants: list[str], copy_gbps: float, tflops: float) -> list[dict]:
    """Production against each variant (all already through the table) per B; a variant whose
    eager result here misses the bound is not timed, and each is checked again after its replays."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    extra = B.pool_cache(KV, gen)
    layout = extra.layout
    scale = B.DIM**-0.5
    slots = B.TOPK + B.WINDOW
    rows = []
    for batch in batches:
        swa = B.window_cache(KV, batch, gen)
        sets = B.input_sets(batch, swa, extra, gen)  # synchronises after creating the inputs
        q, swa_idx, swa_len, idx, lengths, sink = sets[0]
        x = (q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale)
        tiles = loop_tiles(batch, slots)
        prod_plan = kernel.plan(q, swa, swa_idx, extra, idx)
        ref_o, ref_lse = sparse_attention_ref(*x)

        def err_of(o, lse):
            return max(error_report(o, ref_o).rel, error_report(lse, ref_lse).rel)

        prod_us = B._median_graph_ms(B.rotating(kernel.mma_attention, swa, extra, sets, scale)) * 1e3
        unique = int(torch.unique(swa_idx).numel()) + int(torch.unique(idx).numel())
        moved = unique * layout.token_bytes + 2 * q.numel() * q.element_size()
        floor_us = max(moved / (copy_gbps * 1e9), 2 * 2 * batch * B.HEADS * slots * B.DIM / (tflops * 1e12)) * 1e6
        p = kernel.plan(q, swa, swa_idx, extra, idx, tiles)
        row = {"batch": batch, "production_engine": prod_plan.engine, "production_tiles": str(prod_plan.tiles),
               "production_us": prod_us, "gluon_chunk": p.chunk, "gluon_nsplit": p.nsplit, "floor_us": floor_us,
               "input_sets": len(sets), "variants": {}}
        roof = lambda us: f"{floor_us / us:6.1%}" if us == us else "   -  "  # noqa: E731
        print(f"B {batch:3d}  production {prod_us:7.1f} us ({roof(prod_us)}, {prod_plan.engine})  "
              f"chunk {p.chunk} x {p.nsplit}  sets {len(sets)}", flush=True)
        for v in variants:
            err = err_of(*gluon_call(*x, tiles=tiles, variant=v))
            us = alone_us = err_after = float("nan")
            ablation = "@" in v and len(v.split(":")) >= 4 and v.split(":")[3] != "0"
            if err <= REL_TOL or ablation:  # an ablation's results are wrong by design: timed, never checked
                us = B._median_graph_ms(B.rotating(lambda *a, v=v: gluon_call(*a, tiles=tiles, variant=v), swa, extra,
                                                   sets, scale)) * 1e3
                name = v.split("@")[0]  # the loop alone: not for a merging variant, whose loop is the whole call
                if (name.startswith("ws") and not merges(v, p.nsplit)) or (name == "loop" and KV == "fp8"):
                    alone_us = B._median_graph_ms(partials_only(tiles, sets, swa, extra, scale, v)) * 1e3
                torch.cuda.synchronize()
                err_after = err_of(*gluon_call(*x, tiles=tiles, variant=v))
            ok_after = ablation or (err_after <= REL_TOL and (not merges(v, p.nsplit) or counts_at_zero()))
            row["variants"][v] = {"us": us, "loop_alone_us": alone_us, "rel_err": err, "rel_err_after_replays": err_after,
                                  "passed_after_replays": ok_after}
            speed = f"{prod_us / us:5.2f}x" if us == us else "  -  "
            alone = f"; loop alone {alone_us:6.1f}" if alone_us == alone_us else ""
            flag = "" if ok_after else "  FAILED after the replays: discard this timing"
            flag += "  (ablation: results wrong by design)" if ablation else ""
            print(f"       {v:5s} {us:7.1f} us ({roof(us)}{alone})  {speed} of production  err {err:.1e}, "
                  f"after replays {err_after:.1e}{flag}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--batch", default="1,16,32,64")
    ap.add_argument("--variants", default="loop", help=f"comma-separated, of {', '.join(VARIANTS)}; "
                    "ws@SUB:NST:REGS: the warp-specialised loop with other constants")
    ap.add_argument("--skip-check", action="store_true", help="time without the table (a failed variant is still not timed)")
    ap.add_argument("--kv", default="fp8", choices=sorted(ENGINES), help="the KV layout (bf16: loop is kernel_gluon.py per cache)")
    args = ap.parse_args()
    global KV
    KV = args.kv
    variants = args.variants.split(",")
    unknown = [v for v in variants if v.split("@")[0] not in ENGINES[KV]]
    if unknown:
        ap.error(f"unknown --variants {unknown} for --kv {KV}; known: {', '.join(ENGINES[KV])}")
    t0 = time.time()
    out = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__, "kv": KV,
           "gluon_available": kernel.gluon_available(), "rel_tol": REL_TOL, "variants": variants, "check": {}}
    print(f"{out['device']}, Triton {out['triton']}, torch {out['torch']}; Gluon available: {out['gluon_available']}",
          flush=True)
    passed_variants = []
    for v in variants:
        if args.skip_check or "@" in v:  # constants variants: checked at the timed shapes only
            passed_variants.append(v)
            continue
        cases, ok = check_cases(v)
        passed = sum(r["passed"] for r in cases)
        scored = [r for r in cases if "rel_err_o" in r or "error" in r]
        worst = max(scored, key=lambda r: max(r.get("rel_err_o", float("inf")), r.get("rel_err_lse", float("inf"))))
        out["check"][v] = {"passed": passed, "total": len(cases), "cases": cases, "worst_case": worst["case"]}
        print(f"{v}: correctness {passed}/{len(cases)} cases within rel {REL_TOL:g}; worst {worst['case']} "
              f"(o {worst.get('rel_err_o', float('nan')):.2e}, lse {worst.get('rel_err_lse', float('nan')):.2e}) "
              f"[{time.time() - t0:.0f} s]", flush=True)
        if ok:
            passed_variants.append(v)
        else:
            print(f"{v} FAILED the correctness table: not timed, no speed-up reported", flush=True)
    if passed_variants:
        copy_gbps, tflops = B.copy_bandwidth_gbps(), B.matmul_tflops()
        out.update(copy_gbps=copy_gbps, matmul_tflops=tflops)
        print(f"copy {copy_gbps:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s; K {B.TOPK} + window {B.WINDOW}, {KV} KV; "
              "(x%) = of the roofline", flush=True)
        out["timing"] = time_batches([int(b) for b in args.batch.split(",")], passed_variants, copy_gbps, tflops)
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
