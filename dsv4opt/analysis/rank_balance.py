"""The ranks of one run side by side: each rank's compute and communication over time, and the spread.

A rank's timeline is its work intervals: its GPU kernels when the trace has any, else its top-level
CPU operators (one per thread at a time). Communication is what the category tables call
communication (NCCL kernels, `c10d::` operators) and, on a CPU, the collective backend's own ranges
(gloo runs a collective on its own threads, `gloo:all_gather`, while the calling thread waits outside
any operator); compute is every other interval. Per rank: the time covered by compute, by
communication, and by both at once (overlap: communication hidden behind compute), within the
window from the first interval's start to the last one's end.

Across ranks: the slowest rank is the one with the most compute (the others wait for it inside their
collectives, which shows as communication on them), the imbalance is its compute over the mean
compute, minus one.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from dsv4opt.analysis.categories import COMMUNICATION
from dsv4opt.analysis.classify import classify_cpu_op_names, classify_names
from dsv4opt.analysis.profile import RankBalance, RankRow, RankTimeline
from dsv4opt.analysis.steps import step_ranges
from dsv4opt.trace import Trace

BACKEND_RANGES = re.compile(r"^(?:gloo|nccl|ucc|mpi):")  # ProcessGroup record_function names


def rank_timeline(trace: Trace) -> RankTimeline:
    """One rank's window, compute, communication and overlap (µs, the whole trace), and its steps."""
    start, end, comm = _work_intervals(trace)
    basis = "gpu" if not trace.kernels.empty else "cpu"
    steps = len(step_ranges(trace.annotations, prefer_cpu=True)[1])
    if len(start) == 0:
        return RankTimeline(basis=basis, steps=steps, window_us=0.0, compute_us=0.0, comm_us=0.0, overlap_us=0.0)
    c = union(start[comm], end[comm])
    w = union(start[~comm], end[~comm])
    return RankTimeline(basis=basis, steps=steps, window_us=float(end.max() - start.min()), compute_us=length(w),
                        comm_us=length(c), overlap_us=overlap(c, w))


def rank_balance(ranks: list[RankRow]) -> RankBalance | None:
    """The run across its ranks, from each rank's timeline; None without two timed ranks."""
    rows = [r for r in ranks if r.timeline is not None and r.timeline.window_us > 0]
    if len(rows) < 2:
        return None
    compute = np.array([r.timeline.compute_us for r in rows])
    window = np.array([r.timeline.window_us for r in rows])
    comm = np.array([r.timeline.comm_us for r in rows])
    exposed = comm - np.array([r.timeline.overlap_us for r in rows])
    slowest = int(np.argmax(compute))
    mean = float(compute.mean())
    return RankBalance(
        basis=rows[0].timeline.basis,
        slowest_rank=rows[slowest].rank,
        imbalance=float(compute[slowest] / mean - 1.0) if mean > 0 else 0.0,
        comm_share=float(np.mean(comm / window)),
        comm_share_max=float(np.max(comm / window)),
        exposed_comm_share=float(np.mean(exposed / window)),
        compute_us_spread=float(compute.max() - compute.min()),
    )


def _work_intervals(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[intervals] start_us, end_us, is_communication."""
    k = trace.kernels
    if not k.empty:
        start = k["ts_us"].to_numpy(np.float64)
        comm = (classify_names(k["name"]) == COMMUNICATION).to_numpy()
        return start, start + k["dur_us"].to_numpy(np.float64), comm
    ops = _top_level(trace.cpu_ops)
    ann = trace.annotations
    backend = ann[ann["name"].astype(object).str.match(BACKEND_RANGES.pattern).fillna(False).to_numpy(bool)] \
        if not ann.empty else ann
    start = np.concatenate([ops["ts_us"].to_numpy(np.float64), backend["ts_us"].to_numpy(np.float64)])
    dur = np.concatenate([ops["dur_us"].to_numpy(np.float64), backend["dur_us"].to_numpy(np.float64)])
    comm = np.concatenate([(classify_cpu_op_names(ops["name"].astype(object)) == COMMUNICATION).to_numpy(bool),
                           np.ones(len(backend), bool)])
    return start, start + dur, comm


def _top_level(ops: pd.DataFrame) -> pd.DataFrame:
    """The operators no other operator on their thread encloses (nested ones add no time of their own)."""
    if ops.empty:
        return ops
    o = ops.assign(end=ops["ts_us"] + ops["dur_us"], thread=ops["pid"] * (1 << 32) + ops["tid"])
    o = o.sort_values(["thread", "ts_us", "dur_us"], ascending=[True, True, False], kind="mergesort")
    before = o.groupby("thread")["end"].cummax().groupby(o["thread"]).shift()
    return o[before.isna().to_numpy() | (o["ts_us"] >= before).to_numpy()]


def union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as disjoint, sorted (start, end) arrays."""
    if len(start) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(start, kind="mergesort")
    s, e = start[order], np.maximum.accumulate(end[order])
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > e[:-1]
    last = np.r_[np.flatnonzero(new)[1:] - 1, len(s) - 1]  # each block's last interval holds its end
    return s[new], e[last]


def length(intervals: tuple[np.ndarray, np.ndarray]) -> float:
    s, e = intervals
    return float((e - s).sum())


def overlap(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two disjoint interval sets (each from `union`)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return 0.0
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    da = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])), np.zeros(2 * len(b[0]))])
    db = np.concatenate([np.zeros(2 * len(a[0])), np.ones(len(b[0])), -np.ones(len(b[1]))])
    order = np.argsort(times, kind="mergesort")
    t, in_a, in_b = times[order], np.cumsum(da[order]), np.cumsum(db[order])
    both = (in_a[:-1] > 0) & (in_b[:-1] > 0)
    return float(np.diff(t)[both].sum())
