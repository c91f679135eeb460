"""CPU-operator ranking by self time, for traces that hold no GPU events (time_basis "cpu_self")."""

from __future__ import annotations

import numpy as np
import pandas as pd


def cpu_self_times(cpu_ops: pd.DataFrame) -> np.ndarray:
    """[ops] self time = own duration minus that of directly nested operators on the same thread."""
    n = len(cpu_ops)
    self_us = cpu_ops["dur_us"].to_numpy().astype(np.float64).copy()
    if n == 0:
        return self_us
    order = np.lexsort((-cpu_ops["dur_us"].to_numpy(), cpu_ops["ts_us"].to_numpy(), cpu_ops["tid"].to_numpy(), cpu_ops["pid"].to_numpy()))
    ts = cpu_ops["ts_us"].to_numpy()
    end = ts + cpu_ops["dur_us"].to_numpy()
    dur = cpu_ops["dur_us"].to_numpy()
    thread = cpu_ops["pid"].to_numpy() * (1 << 32) + cpu_ops["tid"].to_numpy()
    stack: list[int] = []
    current = None
    for i in order:
        if thread[i] != current:
            stack.clear()
            current = thread[i]
        while stack and end[stack[-1]] < ts[i]:
            stack.pop()
        if stack:
            self_us[stack[-1]] -= dur[i]
        stack.append(i)
    return np.maximum(self_us, 0.0)


def cpu_op_table(cpu_ops: pd.DataFrame) -> tuple[float, pd.DataFrame]:
    """(total self time, [names] name, short_name, category, count, total_us, mean_us, share)."""
    cols = ["name", "short_name", "category", "count", "total_us", "mean_us", "share"]
    if cpu_ops.empty:
        return 0.0, pd.DataFrame({c: pd.Series(dtype=object if c in ("name", "short_name", "category") else float) for c in cols})
    frame = pd.DataFrame({"name": cpu_ops["name"].astype(object).to_numpy(), "self": cpu_self_times(cpu_ops)})
    g = frame.groupby("name")["self"]
    out = pd.DataFrame({"count": g.size(), "total_us": g.sum()}).reset_index()
    total = float(frame["self"].sum())
    out["mean_us"] = out["total_us"] / out["count"]
    out["share"] = out["total_us"] / total if total > 0 else 0.0
    out["short_name"] = out["name"]
    out["category"] = "cpu_op"
    return total, out.sort_values(["total_us", "name"], ascending=[False, True], kind="mergesort").reset_index(drop=True)[cols]
