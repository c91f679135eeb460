"""One device call for mma-attn: full bf16 correctness table, CUDA-graph replay check, the bench
(`dsv4opt bench mma-attn`'s code path), then a tile sweep; short table printed last.

    PYTHONPATH=. python3 scripts/gpu_mma_attn.py      # logs and JSON under $OUT (default gpu_out/)
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import torch
from rich.console import Console

START = time.time()
OUT = Path(os.environ.get("OUT", "gpu_out"))
OUT.mkdir(parents=True, exist_ok=True)
SWEEP_UNTIL = START + float(os.environ.get("SWEEP_BUDGET_S", "250"))
LOG = open(OUT / "log.txt", "w")


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


def sweep(kv: torch.Tensor) -> list[dict]:
    from dsv4opt.optimizations.mma_attn.bench import HEADS, TOPK, _median_graph_ms, bench_inputs
    from dsv4opt.optimizations.mma_attn.kernel import Tiles, choose_tiles, mma_sparse_decode

    gen = torch.Generator(device="cuda").manual_seed(1)
    results = []
    variants = [(32, 8, 1), (32, 8, 3), (64, 8, 2), (16, 8, 2), (32, 4, 2), (32, 16, 2), (64, 8, 1)]
    for batch in (64, 32, 16, 1):
        q, indices, lengths, sink = bench_inputs(batch, kv, gen)
        base = choose_tiles(batch, HEADS, TOPK, q.device)
        tiles = [replace(base, nsplit=n) for n in sorted({max(1, base.nsplit // 2), base.nsplit, base.nsplit * 2, 1})]
        tiles += [Tiles(base.block_h, bk, base.nsplit, w, s) for bk, w, s in variants]
        for t in tiles:
            if time.time() > SWEEP_UNTIL:
                log("sweep: out of time budget, stopping")
                return results
            try:
                ms = _median_graph_ms(lambda: mma_sparse_decode(q, kv, indices, lengths, sink, 512**-0.5, t))
                row = {"batch": batch, **asdict(t), "us": ms * 1e3}
            except Exception as exc:  # noqa: BLE001 - a tile that does not fit is a result too
                row = {"batch": batch, **asdict(t), "us": None, "error": f"{type(exc).__name__}: {str(exc)[:120]}"}
            log("sweep", json.dumps(row))
            results.append(row)
    return results


def main() -> int:
    import triton

    from dsv4opt.optimizations.mma_attn.bench import POOL_GB, DIM, render, run_bench

    log(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    console = Console(width=220, record=True)
    result = None
    try:
        result = run_bench(on_step=lambda m: log(f"[{time.time() - START:5.0f} s] {m}"))
        for c in result.check.details["cases"]:
            log(f"check {c['case']:<34} o {c['rel_err_o']:.2e} lse {c['rel_err_lse']:.2e} "
                f"baseline {c['baseline_rel_err_o']:.2e} vs-baseline {c['rel_diff_vs_baseline']:.2e} "
                f"nonfinite {c['nonfinite']} {'ok' if c['passed'] else 'FAIL'}")
        (OUT / "bench.json").write_text(json.dumps(result.as_json(), indent=1))
    except Exception:  # noqa: BLE001 - keep going to the sweep and report
        log(traceback.format_exc())
    try:
        log(graph_replay_check())
    except Exception:  # noqa: BLE001
        log(traceback.format_exc())
    rows = []
    if result is not None and result.check.passed:
        log(f"[{time.time() - START:5.0f} s] sweep")
        kv = torch.randn(int(POOL_GB * 2**30) // (DIM * 2), DIM, device="cuda", dtype=torch.bfloat16)
        rows = sweep(kv)
        (OUT / "sweep.json").write_text(json.dumps(rows, indent=1))
    try:
        res = kernel_resources()
        (OUT / "resources.json").write_text(json.dumps(res, indent=1))
        for r in res:
            log("resources", json.dumps(r))
    except Exception:  # noqa: BLE001
        log(traceback.format_exc())

    log(f"[{time.time() - START:5.0f} s] done")
    best = {}
    for r in rows:
        if r["us"] is not None and (r["batch"] not in best or r["us"] < best[r["batch"]]["us"]):
            best[r["batch"]] = r
    for b, r in sorted(best.items()):
        log(f"best B={b}: {r['us']:.1f} us  bk {r['block_k']} warps {r['num_warps']} stages {r['num_stages']} nsplit {r['nsplit']}")
    if result is not None:
        log("check:", result.check.summary, json.dumps(result.check.figures))
        console.print(render(result))
        LOG.write(console.export_text())
    return 0 if result is not None and result.check.passed else 1


if __name__ == "__main__":
    sys.exit(main())
