"""CPU-operator analysis for traces that hold no GPU events (time_basis "cpu_self").

Operators are ranked by self time and sorted into the fixed categories by the CPU rule table
(classify.CPU_RULES). record_function and ProfilerStep#N ranges are not operators here: the trace
reader keeps them apart as annotations, so they never enter the ranking; they give the steps and
the model parts instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dsv4opt.analysis import parts, steps
from dsv4opt.analysis.classify import classify_cpu_op_names
from dsv4opt.analysis.intervals import Intervals

TABLE_COLUMNS = ["name", "short_name", "category", "count", "total_us", "mean_us", "share"]


@dataclass
class CpuAnalysis:
    """One rank's CPU-only figures; the same shapes as the GPU path's so the profile reads alike."""

    total_us: float  # sum of operator self times
    table: pd.DataFrame  # [names] TABLE_COLUMNS
    steps: dict | None  # steps.steps_summary shape, figures in CPU self time and operator calls
    parts: pd.DataFrame  # [parts] parts.PART_COLUMNS, empty without part annotations


def analyze_cpu_ops(cpu_ops: pd.DataFrame, annotations: pd.DataFrame) -> CpuAnalysis:
    """Rank, step and part figures of the CPU operators of one trace."""
    self_us = cpu_self_times(cpu_ops)
    total = math.fsum(self_us.tolist())
    return CpuAnalysis(
        total_us=total,
        table=_table(cpu_ops["name"].astype(object).to_numpy(), self_us, total),
        steps=cpu_steps(cpu_ops, self_us, annotations),
        parts=cpu_parts(cpu_ops, self_us, annotations, total),
    )


def cpu_self_times(cpu_ops: pd.DataFrame) -> np.ndarray:
    """[ops] self time = own duration minus that of directly nested operators on the same thread
    (an operator's parent: the innermost earlier one still open at its start)."""
    dur = cpu_ops["dur_us"].to_numpy().astype(np.float64)
    if len(cpu_ops) == 0:
        return dur.copy()
    ts = cpu_ops["ts_us"].to_numpy().astype(np.float64)
    thread = cpu_ops["pid"].to_numpy() * (1 << 32) + cpu_ops["tid"].to_numpy()
    parent = Intervals.of(ts, ts + dur, thread).parents()
    nested = parent >= 0
    children = np.bincount(parent[nested], weights=dur[nested], minlength=len(dur))
    return np.maximum(dur - children, 0.0)


def cpu_steps(cpu_ops: pd.DataFrame, self_us: np.ndarray, annotations: pd.DataFrame) -> dict | None:
    """The profile's `steps` from CPU-side ProfilerStep#N (or step-named) ranges, None without them.

    An operator belongs to the step its start falls in. In the GPU summary's keys, gpu_us is the
    CPU self time of a step's operators, launches its operator calls, median_kernel_us the median
    operator self time; span_us runs from the first operator's start to the last one's end.
    """
    source, ranges = steps.step_ranges(annotations, prefer_cpu=True)
    if ranges.empty or cpu_ops.empty:
        return None
    ts = cpu_ops["ts_us"].to_numpy().astype(np.float64)
    end = ts + cpu_ops["dur_us"].to_numpy()
    table = steps.step_table(pd.DataFrame({"ts_us": ts, "dur_us": self_us}), ts, ranges)
    idx = np.searchsorted(ranges["start_us"].to_numpy(), ts, side="right") - 1
    inside = (idx >= 0) & (ts <= ranges["end_us"].to_numpy()[np.clip(idx, 0, None)])
    # step_table's span would end at start + self time; an operator ends at start + duration.
    g = pd.DataFrame({"step": idx[inside], "ts": ts[inside], "end": end[inside]}).groupby("step")
    table["span_us"] = (g["end"].max() - g["ts"].min()).reindex(range(len(ranges))).to_numpy()
    return steps.steps_summary(source, table, self_us[inside])


def cpu_parts(cpu_ops: pd.DataFrame, self_us: np.ndarray, annotations: pd.DataFrame, total_us: float) -> pd.DataFrame:
    """[parts] part, count, total_us, share: each operator's self time in the innermost non-step
    record_function range around its middle on its own thread (an operator that opens a part's range
    around its own work, as a compiled block's opaque ops do, belongs to that part)."""
    if cpu_ops.empty:
        return parts.part_table_of(None, self_us, total_us)
    ts = cpu_ops["ts_us"].to_numpy().astype(np.float64) + cpu_ops["dur_us"].to_numpy().astype(np.float64) / 2
    # kernel_parts places a kernel by its launch (time, thread) within CPU-side ranges: an
    # operator is its own launch.
    part = parts.kernel_parts(ts, ts, cpu_ops["tid"].to_numpy(), annotations)
    return parts.part_table_of(part, self_us, total_us)


def _table(names: np.ndarray, self_us: np.ndarray, total: float) -> pd.DataFrame:
    if len(names) == 0:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("name", "short_name", "category") else float) for c in TABLE_COLUMNS})
    g = pd.DataFrame({"name": names, "self": self_us}).groupby("name")["self"]
    out = pd.DataFrame({"count": g.size(), "total_us": g.sum()}).reset_index()
    out["mean_us"] = out["total_us"] / out["count"]
    out["share"] = out["total_us"] / total if total > 0 else 0.0
    out["short_name"] = out["name"]
    out["category"] = classify_cpu_op_names(out["name"])
    return out.sort_values(["total_us", "name"], ascending=[False, True], kind="mergesort").reset_index(drop=True)[TABLE_COLUMNS]
