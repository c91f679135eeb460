"""Rank entry functions for the launcher tests: module-level, so the ranks can import them by name."""

from __future__ import annotations

import os
import signal
import time

from dsv4opt.errors import DsvOptError


def sum_of_ranks(ctx) -> dict:
    """Every rank's number summed over the group: proves the ranks met and talk."""
    import torch
    import torch.distributed as dist

    ctx.join()
    x = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(x)
    return {"rank": ctx.rank, "sum": float(x), "pid": os.getpid(), "nvls": os.environ.get("NCCL_NVLS_ENABLE")}


def rank_one_fails(ctx, how: str, pid_dir: str) -> None:
    """Rank 1 fails `how` after the rendezvous; the others wait for it in a collective, forever."""
    import torch.distributed as dist

    ctx.join()
    with open(os.path.join(pid_dir, f"{ctx.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if ctx.rank == 1:
        time.sleep(0.2)
        if how == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "user-error":
            raise DsvOptError("out of memory on this rank; lower --concurrency")
        raise RuntimeError("a bug\nwith a second line")
    dist.barrier()


def rank_one_never_joins(ctx, pid_dir: str) -> None:
    with open(os.path.join(pid_dir, f"{ctx.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if ctx.rank == 1:
        time.sleep(600)
    ctx.join()


def reports_progress(ctx) -> None:
    """Rank 0 reports two stages, faster than the parent polls; every rank reports, only rank 0 is heard."""
    import torch.distributed as dist

    ctx.join()
    progress = ctx.progress()
    progress.stage("building", 2)
    progress.advance()
    progress.advance()
    progress.stage("profiling", 3)
    for _ in range(3):
        progress.advance()
    dist.barrier()
