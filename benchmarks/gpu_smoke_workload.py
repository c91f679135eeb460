"""GPU smoke test of the embedded workload: correctness first, then memory and graph timing.

    python benchmarks/gpu_smoke_workload.py [--concurrency 32] [--context 8192] [--steps 10] [--skip-full]

1. dsv4-tiny on the GPU (every Triton kernel compiled; float32 and bf16 activations, FP8 and bf16
   KV layouts) against the float64 reference;
2. dsv4-flash --layers 4: no host sync in the eager step (sync debug mode), the CUDA-graph replay
   gives the same logits as eager steps of an identical workload, estimate vs max allocated;
3. dsv4-flash, all layers: estimate vs max allocated, graph-replayed ms/step and tokens/s.
A short table is printed last. Timing runs only after the checks pass.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dsv4opt.numerics import error_report  # noqa: E402
from dsv4opt.workload.config import ModelConfig  # noqa: E402
from dsv4opt.workload.memory import estimate_memory  # noqa: E402
from dsv4opt.workload.model import DecodeWorkload  # noqa: E402
from dsv4opt.workload.reference import decode_step_ref  # noqa: E402

GIB = 1 << 30


def check_tiny(rows: list) -> bool:
    """Float32 activations match to float32 rounding but for the rare e4m3 rounding flip (~1e-2,
    see tests/workload/test_model.py); bf16 activations add bf16 rounding throughout."""
    cfg = ModelConfig.from_name("dsv4-tiny")
    ok = True
    # bf16 activations: reported, not gated (bf16 rounding and the e4m3 flips it causes compound
    # over the random model's layers; the kernels' bf16 paths are gated in tests/workload).
    for dtype, kv, tol in ((torch.float32, "fp8", 3e-2), (torch.float32, "bf16", 3e-2), (torch.bfloat16, "fp8", None)):
        wl = DecodeWorkload(cfg, concurrency=4, context=40, device="cuda", dtype=dtype, kv=kv)
        tokens = torch.randint(cfg.vocab, (4,), device="cuda")
        worst = None
        for step in range(3):
            ref, _ = decode_step_ref(wl, tokens.cpu())
            out = wl.step(tokens)
            report = error_report(out, ref)
            worst = report if worst is None or report.rel > worst.rel else worst
            tokens = out.argmax(-1)
        good = tol is None or worst.ok(tol)
        ok &= good
        name = f"tiny {str(dtype).removeprefix('torch.')} {kv}-KV"
        verdict = "reported" if tol is None else ("ok" if good else "FAIL")
        print(f"{name}, 3 steps: worst {worst} {verdict}")
        rows.append((name, verdict, "", "", ""))
    return ok


KV = "fp8"


def build(cfg, layers, C, context, max_new) -> tuple[DecodeWorkload, float, float]:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    wl = DecodeWorkload(cfg, concurrency=C, context=context, device="cuda", layers=layers, max_new_tokens=max_new,
                        kv=KV)
    torch.cuda.synchronize()
    return wl, time.perf_counter() - t0, base


def graph_of(wl, tokens):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tokens.copy_(wl.step(tokens).argmax(-1))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = wl.step(tokens)
        tokens.copy_(logits.argmax(-1))
    return graph, logits


def time_graph(graph, steps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def memory_row(name, cfg, wl, C, context, base, max_new) -> tuple:
    est = estimate_memory(cfg.with_layers(wl.cfg.layers), C, context, elem_bytes=2, kv_fp8=wl.kv_layout == "fp8",
                          max_new_tokens=max_new)
    peak = torch.cuda.max_memory_allocated() - base
    held = wl.state_bytes()
    print(f"{name}: estimate {est.total / GIB:.2f} GiB (weights {est.weights / GIB:.2f}, caches {est.caches / GIB:.2f}, "
          f"activations {est.activations / GIB:.2f}); held {sum(held.values()) / GIB:.2f}; peak allocated {peak / GIB:.2f}; "
          f"KV {wl.kv_layout}")
    return est, peak


def check_four_layers(args, rows: list) -> bool:
    cfg = ModelConfig.from_name("dsv4-flash")
    max_new = 64
    C = args.concurrency
    wl, secs, base = build(cfg, 4, C, args.context, max_new)
    tokens = torch.randint(cfg.vocab, (C,), generator=torch.Generator().manual_seed(0)).cuda()
    wl.step(tokens)  # compiles the Triton kernels outside the sync check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        wl.step(tokens)
        sync_free = True
    except RuntimeError as exc:
        print(f"host sync inside the step: {exc}")
        sync_free = False
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    est, peak = memory_row("flash --layers 4", cfg, wl, C, args.context, base, max_new)
    del wl
    gc.collect()

    # Two identical workloads: one replays the captured graph, the other steps eagerly.
    wl_graph, _, _ = build(cfg, 4, C, args.context, max_new)
    wl_eager, _, _ = build(cfg, 4, C, args.context, max_new)
    start = torch.randint(cfg.vocab, (C,), generator=torch.Generator().manual_seed(1)).cuda()
    tokens_g, tokens_e = start.clone(), start.clone()
    graph, logits_g = graph_of(wl_graph, tokens_g)  # one eager warm-up step, then capture
    tokens_e.copy_(wl_eager.step(tokens_e).argmax(-1))
    worst = None
    for _ in range(3):
        graph.replay()
        logits_e = wl_eager.step(tokens_e)
        tokens_e.copy_(logits_e.argmax(-1))
        report = error_report(logits_g, logits_e)
        worst = report if worst is None or report.rel > worst.rel else worst
    same = worst.ok(1e-2)
    print(f"graph replay vs eager (3 steps): worst {worst} {'ok' if same else 'FAIL'}")
    ms = time_graph(graph, args.steps)
    rows.append(("flash 4 layers", "ok" if sync_free and same else "FAIL", f"{est.total / GIB:.1f} / {peak / GIB:.1f}",
                 f"{ms:.2f}", f"{C * 1000 / ms:.0f}"))
    del wl_eager, wl_graph, graph, logits_g
    gc.collect()
    return sync_free and same


def run_full(args, rows: list) -> None:
    cfg = ModelConfig.from_name("dsv4-flash")
    max_new = 64
    C = args.concurrency
    wl, secs, base = build(cfg, None, C, args.context, max_new)
    print(f"built dsv4-flash (43 layers) in {secs:.0f} s")
    tokens = torch.randint(cfg.vocab, (C,), device="cuda")
    graph, _ = graph_of(wl, tokens)
    torch.cuda.synchronize()
    est, peak = memory_row("flash full", cfg, wl, C, args.context, base, max_new)
    ms = time_graph(graph, args.steps)
    rows.append(("flash 43 layers", "ran", f"{est.total / GIB:.1f} / {peak / GIB:.1f}", f"{ms:.2f}", f"{C * 1000 / ms:.0f}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--skip-full", action="store_true", help="stop after the 4-layer checks")
    parser.add_argument("--kv", default="fp8", choices=["fp8", "bf16"], help="KV layout of the dsv4-flash runs")
    args = parser.parse_args()
    global KV
    KV = args.kv
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    rows: list = []
    ok = check_tiny(rows)
    ok &= check_four_layers(args, rows)
    if ok and not args.skip_full:
        run_full(args, rows)
    elif not ok:
        print("checks failed: full-model timing skipped")
    print(f"\n{'run':<26}{'check':<8}{'est/peak GiB':<16}{'ms/step':<10}{'tok/s':<8}")
    for r in rows:
        print(f"{r[0]:<26}{r[1]:<8}{r[2]:<16}{r[3]:<10}{r[4]:<8}")


if __name__ == "__main__":
    main()
