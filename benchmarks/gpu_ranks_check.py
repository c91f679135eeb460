"""On a machine of N GPUs: N ranks over NCCL (one GPU each, every kernel compiled) against one process
holding every request and every expert on cuda:0, as tests/workload/test_ranks.py does over gloo.

Usage: python benchmarks/gpu_ranks_check.py --ranks 2 [--concurrency 4] [--context 40]
Prints the relative error of each step's logits; exits 1 when one exceeds 3e-2 (float32 model).
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch


def step_logits(ctx, concurrency: int, context: int, tokens: list[torch.Tensor]) -> list[torch.Tensor]:
    from dsv4opt.workload.collectives import ProcessGroupRanks
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.model import DecodeWorkload

    device = torch.device("cuda", ctx.rank)
    torch.cuda.set_device(device)
    ctx.join(device)
    wl = DecodeWorkload(ModelConfig.from_name("dsv4-tiny"), concurrency=concurrency, context=context, device=device,
                        dtype=torch.float32, seed=3, comm=ProcessGroupRanks())
    mine = slice(ctx.rank * concurrency, (ctx.rank + 1) * concurrency)
    return [wl.step(t[mine].to(device)).cpu() for t in tokens]


def main() -> int:
    from dsv4opt.capture.launcher import run_ranks
    from dsv4opt.numerics import error_report
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.model import DecodeWorkload

    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--context", type=int, default=40)
    a = p.parse_args()
    tiny = ModelConfig.from_name("dsv4-tiny")
    g = torch.Generator().manual_seed(5)
    tokens = [torch.randint(tiny.vocab, (a.ranks * a.concurrency,), generator=g) for _ in range(3)]
    outs = run_ranks(step_logits, a.ranks, "nccl", tempfile.mkdtemp(prefix="ranks-check-"),
                     args=(a.concurrency, a.context, tokens))
    whole = DecodeWorkload(tiny.with_expert_parallel(1), concurrency=a.ranks * a.concurrency, context=a.context,
                           device="cuda:0", dtype=torch.float32, seed=3)
    worst = 0.0
    for s, t in enumerate(tokens):
        report = error_report(torch.cat([o[s] for o in outs]), whole.step(t.to("cuda:0")))
        print(f"step {s}: {report}")
        worst = max(worst, report.rel if report.nonfinite == 0 else float("inf"))
    print("ranks check", "ok" if worst <= 3e-2 else "FAILED", f"(worst rel {worst:.3e})")
    return 0 if worst <= 3e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
