"""The ranks of one run as a table and a line: compute, communication, overlap, the slowest rank."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dsv4opt.display import MISSING, duration, pct


def print_rank_balance(profile, console: Console) -> None:
    """Per rank (time per step where the traces have steps; comm share: of the rank's window; overlap:
    communication hidden behind compute) and across ranks; nothing for one rank."""
    if not profile.ranks:
        return
    balance = profile.rank_balance
    timelines = [row.timeline for row in profile.ranks]
    per_step = all(t is not None and t.steps for t in timelines)
    cpu = balance is not None and balance.basis == "cpu"
    t = Table(title="per rank" + (" (per step)" if per_step else ""))
    for col in ("rank", "compute", "comm", "comm share", "overlap", "#1 " + ("operator" if cpu else "kernel")):
        t.add_column(col, justify="left" if col.startswith(("rank", "#1")) else "right")
    for row, tl in zip(profile.ranks, timelines):
        top1 = f"{row.kernels[0].display_name} {pct(row.kernels[0].share)}" if row.kernels else MISSING
        if tl is None:  # a profile written before ranks had timelines
            t.add_row(str(row.rank), MISSING, MISSING, MISSING, MISSING, escape(top1))
            continue
        per = tl.steps if per_step else 1
        t.add_row(str(row.rank), duration(tl.compute_us / per), duration(tl.comm_us / per),
                  pct(tl.comm_us / tl.window_us) if tl.window_us else MISSING, duration(tl.overlap_us / per),
                  escape(top1))
    console.print(t)
    if balance is not None:
        what = "CPU operators and the backend's ranges, wall time" if cpu else "GPU kernels"
        console.print(
            f"ranks ({what}): slowest rank {balance.slowest_rank}, compute {pct(balance.imbalance)} over the mean "
            f"(imbalance); communication {pct(balance.comm_share)} of a rank's window on average "
            f"(at most {pct(balance.comm_share_max)}), {pct(balance.exposed_comm_share)} not hidden behind compute",
            highlight=False)
