"""One device call for mma-attn: a sweep of tile families through choose_tiles (reported, not
applied), then the bench with the committed tiles (`dsv4opt bench mma-attn`'s code path: the full
bf16 correctness table first, then timing), a CUDA-graph replay check, and a short table last.

    PYTHONPATH=. python3 scripts/gpu_mma_attn.py              # logs and JSON under $OUT (default gpu_out/)
    PYTHONPATH=. python3 scripts/gpu_mma_attn.py --pool-scan  # time against the KV pool's size
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console

START = time.time()
OUT = Path(os.environ.get("OUT", "gpu_out"))
OUT.mkdir(parents=True, exist_ok=True)
SWEEP_UNTIL = START + float(os.environ.get("SWEEP_BUDGET_S", "170"))
# the pool scan's child processes append to the scan's log; the main run writes its own
_POOL = "--pool-scan" in sys.argv or "--pool-one" in sys.argv
LOG = open(OUT / ("pool_scan.txt" if _POOL else "log.txt"), "a" if "--pool-one" in sys.argv else "w")


def log(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LOG.write(line + "\n")
    LOG.flush()


def graph_replay_check() -> str:
    """Capture the kernel in a CUDA graph, refill the inputs, replay, compare with eager."""
    from dsv4opt.optimizations.mma_attn.cases import AttnCase, make_inputs
    from dsv4opt.optimizations.mma_attn.kernel import mma_sparse_decode
    from dsv4opt.numerics import error_report

    a = make_inputs(AttnCase(32, 640, "short"), "cuda", torch.bfloat16, seed=1)
    b = make_inputs(AttnCase(32, 640, "half_unused"), "cuda", torch.bfloat16, seed=2)
    mma_sparse_decode(*a.args())  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, lse = mma_sparse_decode(*a.args())
    for dst, src in ((a.q, b.q), (a.kv, b.kv), (a.indices, b.indices), (a.lengths, b.lengths), (a.sink, b.sink)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    ref_o, ref_lse = mma_sparse_decode(*b.args())
    return f"graph replay vs eager on new inputs: o {error_report(o, ref_o)}; lse {error_report(lse, ref_lse)}"


def kernel_resources() -> list[dict]:
    """Registers, spills and shared memory of every compiled variant of the main kernel."""
    from dsv4opt.optimizations.mma_attn import kernel as k

    rows = []
    for cache in getattr(k._mma_sparse_decode_kernel, "device_caches", {}).values():
        for key, compiled in cache[0].items():
            try:
                compiled._init_handles()
            except Exception:  # noqa: BLE001 - diagnostics only
                pass
            md = compiled.metadata
            rows.append({
                "key": str(key)[-160:],
                "num_warps": getattr(md, "num_warps", None),
                "num_stages": getattr(md, "num_stages", None),
                "shared": getattr(md, "shared", None),
                "n_regs": getattr(compiled, "n_regs", None),
                "n_spills": getattr(compiled, "n_spills", None),
            })
    return rows


# Round 2 (docs/kernels/mma_attn.md): the two committed families (kernel.TILE_DEFAULTS and
# kernel.SMALL_BATCH_TILES) across small B, for the crossover SMALL_BATCH_MAX. Deeper pipelines of
# 32-row tiles and an L2 prefetch of later tiles' rows were tried in round 2 too, and were slower.
FAMILIES = [
    dict(block_k=64, num_warps=8, num_stages=2, block_v=0, reload_v=False),
    dict(block_k=32, num_warps=4, num_stages=4, block_v=128, reload_v=True),
]
SWEEP_BATCHES = tuple(int(b) for b in os.environ.get("SWEEP_B", "64,32,16,1").split(","))
SPLIT_FACTORS = tuple(float(f) for f in os.environ.get("SPLIT_FACTORS", "0.5,1.0").split(","))


def sweep(kv: torch.Tensor) -> list[dict]:
    """Time every tile family x split factor x B through choose_tiles itself."""
    import triton.testing

    from dsv4opt.optimizations.mma_attn import kernel
    from dsv4opt.optimizations.mma_attn.bench import HEADS, TOPK, input_sets, rotating

    gen = torch.Generator(device="cuda").manual_seed(1)
    inputs = {b: input_sets(b, kv, gen) for b in SWEEP_BATCHES}
    saved = dict(kernel.TILE_DEFAULTS)
    saved_small = kernel.SMALL_BATCH_MAX
    kernel.SMALL_BATCH_MAX = 0  # every B through the family under test
    results = []
    for fam_id, fam in enumerate(FAMILIES):
        for factor in SPLIT_FACTORS:
            for batch, sets in inputs.items():
                if time.time() > SWEEP_UNTIL:
                    log("sweep: out of time budget, stopping")
                    kernel.TILE_DEFAULTS.update(saved)
                    kernel.SMALL_BATCH_MAX = saved_small
                    return results
                kernel.TILE_DEFAULTS.update(fam, split_factor=factor)
                t = kernel.choose_tiles(batch, HEADS, TOPK, kv.device)
                row = {"family": fam_id, "split_factor": factor, "batch": batch, **asdict(t)}
                try:
                    fn = rotating(lambda *a: kernel.mma_sparse_decode(*a, tiles=t), kv, sets, 512**-0.5)
                    row["us"] = 1e3 * float(triton.testing.do_bench_cudagraph(fn, rep=25, return_mode="median"))
                except Exception as exc:  # noqa: BLE001 - a tile that does not fit is a result too
                    row["us"] = None
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
                log("sweep", json.dumps(row))
                results.append(row)
    kernel.TILE_DEFAULTS.update(saved)
    kernel.SMALL_BATCH_MAX = saved_small
    return results


def best_family(rows: list[dict]):
    """(family, split factor) with the least sum of log times over all four B, among whole-width
    families (block_v 0); None if none complete."""
    import math

    scores = {}
    for fam_id in range(len(FAMILIES)):
        for factor in SPLIT_FACTORS:
            ts = [r["us"] for r in rows if r["family"] == fam_id and r["split_factor"] == factor]
            if len(ts) == len(SWEEP_BATCHES) and all(t is not None for t in ts) and not FAMILIES[fam_id]["block_v"]:
                scores[(fam_id, factor)] = sum(math.log(t) for t in ts)
    if not scores:
        return None
    return min(scores, key=scores.get)


def pool_scan_one(kernel_name: str, pool_gb: float) -> None:
    """One kernel on one pool size, B = 32 and 64 (a fault kills the CUDA context: one process each)."""
    import triton.testing

    from dsv4opt.optimizations.mma_attn.bench import DIM, input_sets, rotating
    from dsv4opt.optimizations.mma_attn.kernel import mma_sparse_decode
    from dsv4opt.workload.attention import sparse_decode_torch

    fn = {"mma": mma_sparse_decode, "torch": sparse_decode_torch}[kernel_name]
    kv = torch.randn(int(pool_gb * 2**30) // (DIM * 2), DIM, device="cuda", dtype=torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(2)
    for batch in (32, 64):
        sets = input_sets(batch, kv, gen)
        call = rotating(fn, kv, sets, DIM**-0.5)
        call()
        torch.cuda.synchronize()
        us = 1e3 * triton.testing.do_bench_cudagraph(call, rep=50, return_mode="median")
        log(f"pool {pool_gb:5.2f} GB  B={batch:<3} {kernel_name} {us:6.1f} us")


def pool_scan() -> None:
    """KV pools from 0.25 to 16 GB, each kernel in its own process with blocking launches, so a
    fault names the kernel and the pool that caused it."""
    import subprocess

    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    for pool_gb in ("0.25", "4", "16"):
        for kernel_name in ("mma", "torch"):
            proc = subprocess.run([sys.executable, __file__, "--pool-one", kernel_name, pool_gb],
                                  env=env, capture_output=True, text=True, timeout=300)
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            log(f"pool-scan {kernel_name} {pool_gb} GB exit {proc.returncode}: " + " | ".join(tail))


def main() -> int:
    import triton

    if "--pool-scan" in sys.argv:
        pool_scan()
        return 0
    if "--pool-one" in sys.argv:
        at = sys.argv.index("--pool-one")
        pool_scan_one(sys.argv[at + 1], float(sys.argv[at + 2]))
        return 0

    from dsv4opt.optimizations.mma_attn import kernel
    from dsv4opt.optimizations.mma_attn.bench import DIM, POOL_GB, render, run_bench

    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    kv = torch.randn(int(POOL_GB * 2**30) // (DIM * 2), DIM, device="cuda", dtype=torch.bfloat16)
    rows = sweep(kv)
    del kv
    (OUT / "sweep.json").write_text(json.dumps(rows, indent=1))
    best = best_family(rows)
    if best is not None:
        log(f"sweep: best whole-width family over all B: {FAMILIES[best[0]]} x{best[1]} (not applied)")
    log(f"[{time.time() - START:5.0f} s] the bench runs the committed tiles: {kernel.TILE_DEFAULTS}, "
        f"B <= {kernel.SMALL_BATCH_MAX}: {kernel.SMALL_BATCH_TILES}")

    console = Console(width=220, record=True)
    result = None
    try:
        result = run_bench(on_step=lambda m: log(f"[{time.time() - START:5.0f} s] {m}"))
        for c in result.check.details["cases"]:
            log(f"check {c['case']:<34} o {c['rel_err_o']:.2e} lse {c['rel_err_lse']:.2e} "
                f"baseline {c['baseline_rel_err_o']:.2e} vs-baseline {c['rel_diff_vs_baseline']:.2e} "
                f"nonfinite {c['nonfinite']} {'ok' if c['passed'] else 'FAIL'}")
        (OUT / "bench.json").write_text(json.dumps({**result.as_json(), "tile_defaults": kernel.TILE_DEFAULTS,
                                                    "small_batch_tiles": kernel.SMALL_BATCH_TILES,
                                                    "small_batch_max": kernel.SMALL_BATCH_MAX}, indent=1))
    except Exception:  # noqa: BLE001 - keep going and report
        log(traceback.format_exc())
    try:
        log(graph_replay_check())
    except Exception:  # noqa: BLE001
        log(traceback.format_exc())
    try:
        res = kernel_resources()
        (OUT / "resources.json").write_text(json.dumps(res, indent=1))
    except Exception:  # noqa: BLE001
        log(traceback.format_exc())

    log(f"[{time.time() - START:5.0f} s] done")
    for fam_id, fam in enumerate(FAMILIES):
        for factor in SPLIT_FACTORS:
            ts = {r["batch"]: r["us"] for r in rows if r["family"] == fam_id and r["split_factor"] == factor}
            if ts:
                cells = " ".join(f"B{b}={'-' if t is None else f'{t:.1f}'}" for b, t in sorted(ts.items()))
                log(f"family {fam_id} x{factor}: {cells}  {fam}")
    log(f"tile defaults used: {kernel.TILE_DEFAULTS}")
    if result is not None:
        log("check:", result.check.summary, json.dumps(result.check.figures))
        console.print(render(result))
        LOG.write(console.export_text())
    return 0 if result is not None and result.check.passed else 1


if __name__ == "__main__":
    sys.exit(main())
