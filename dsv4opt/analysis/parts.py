"""Model-part attribution: GPU time per record_function range (attn, indexer, mhc_pre, moe, ...)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dsv4opt.analysis.steps import STEP_LIKE, STEP_NAME

NO_PART = "(outside any annotation)"


def part_table(kernels: pd.DataFrame, launch_ts_us: np.ndarray, launch_tid: np.ndarray,
               annotations: pd.DataFrame, total_us: float) -> pd.DataFrame:
    """[parts] part, count, total_us, share. Each kernel goes to the innermost annotation around it:
    GPU-side ranges by the kernel's own time when the trace has them, else CPU-side ranges on the
    launching thread by launch time. Step ranges (ProfilerStep#N, names with step/iteration) are not parts. Empty when the trace
    has no other annotations."""
    cols = ["part", "count", "total_us", "share"]
    empty = pd.DataFrame({c: pd.Series(dtype=object if c == "part" else float) for c in cols})
    if kernels.empty or annotations.empty:
        return empty
    names = annotations["name"].astype(object)
    usable = ~(names.str.match(STEP_NAME.pattern).fillna(False).to_numpy(bool)
               | names.str.contains(STEP_LIKE.pattern, case=False, regex=True).fillna(False).to_numpy(bool))
    ann = annotations[usable]
    if ann.empty:
        return empty
    gpu = ann[ann["on_gpu"] == 1]
    if not gpu.empty:
        ann, t, tid = gpu, kernels["ts_us"].to_numpy(), None
    else:
        ann, t, tid = ann[ann["on_gpu"] == 0], launch_ts_us, launch_tid
    # Innermost = the latest-starting range that still covers t; ranges sorted by start.
    ann = ann.sort_values("ts_us", kind="mergesort")
    a_start = ann["ts_us"].to_numpy()
    a_end = a_start + ann["dur_us"].to_numpy()
    a_tid = ann["tid"].to_numpy()
    a_name = ann["name"].astype(object).to_numpy()
    part = np.full(len(kernels), NO_PART, object)
    last = np.searchsorted(a_start, t, side="right") - 1
    for i in np.flatnonzero(np.isfinite(t) & (last >= 0)):
        j = last[i]
        while j >= 0:
            if a_end[j] >= t[i] and (tid is None or a_tid[j] == tid[i]):
                part[i] = a_name[j]
                break
            j -= 1
            if last[i] - j > 256:
                break
    frame = pd.DataFrame({"part": part, "dur": kernels["dur_us"].to_numpy()})
    g = frame.groupby("part")["dur"]
    out = pd.DataFrame({"count": g.size(), "total_us": g.sum()}).reset_index()
    out["share"] = out["total_us"] / total_us if total_us > 0 else 0.0
    return out.sort_values("total_us", ascending=False, kind="mergesort").reset_index(drop=True)[cols]
