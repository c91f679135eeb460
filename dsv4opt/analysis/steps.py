"""Per-step figures: GPU time, launches and median kernel duration per decode/training step."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

STEP_NAME = re.compile(r"^ProfilerStep#\d+$")
STEP_LIKE = re.compile(r"step|iteration")


def step_ranges(annotations: pd.DataFrame, prefer_cpu: bool = False) -> tuple[str, pd.DataFrame]:
    """Where steps come from and their [steps] name, start_us, end_us, on_gpu.

    ProfilerStep#N ranges when present (GPU-side copies preferred: they bound the kernels directly;
    CPU-side ones with `prefer_cpu`, for when every kernel's launch is known: a step then owns the
    kernels it launched, which stays true under CUDA-graph replay, where Kineto's GPU-side step
    ranges were seen cutting replays apart - 12128 and 4781 of a 26825-kernel step on an H200);
    else the outermost user annotations named like a step (SGLang's `step[DECODE bs=32]`, a
    `decode_step`, ...), GPU-side preferred. Model-part annotations (attn, moe, ...) are never steps.
    """
    empty = pd.DataFrame({"name": pd.Series(dtype=object), "start_us": [], "end_us": [], "on_gpu": []})
    if annotations.empty:
        return "", empty
    names = annotations["name"].astype(object)
    is_step = names.str.match(STEP_NAME.pattern).fillna(False).to_numpy(bool)
    on_gpu = annotations["on_gpu"].to_numpy() == 1
    order = ((is_step & on_gpu, "ProfilerStep (GPU)"), (is_step & ~on_gpu, "ProfilerStep"))
    for mask, source in (order[::-1] if prefer_cpu else order):
        if mask.any():
            return source, _ranges(annotations[mask], names[mask])
    steplike = names.str.contains(STEP_LIKE.pattern, case=False, regex=True).fillna(False).to_numpy(bool) & ~is_step
    for mask, source in ((steplike & on_gpu, "step annotations (GPU)"), (steplike & ~on_gpu, "step annotations")):
        if mask.any():
            r = _ranges(annotations[mask], names[mask])
            # Outermost only: drop ranges that start inside an earlier kept one.
            kept_end = np.maximum.accumulate(r["end_us"].to_numpy())
            top = np.ones(len(r), bool)
            top[1:] = r["start_us"].to_numpy()[1:] >= kept_end[:-1]
            return source, r[top].reset_index(drop=True)
    return "", empty


def _ranges(rows: pd.DataFrame, names: pd.Series) -> pd.DataFrame:
    out = pd.DataFrame({
        "name": names.to_numpy(),
        "start_us": rows["ts_us"].to_numpy(),
        "end_us": rows["ts_us"].to_numpy() + rows["dur_us"].to_numpy(),
        "on_gpu": rows["on_gpu"].to_numpy(),
    })
    return out.drop_duplicates(["name", "start_us"]).sort_values("start_us", kind="mergesort").reset_index(drop=True)


def step_table(kernels: pd.DataFrame, anchor_us: np.ndarray, ranges: pd.DataFrame) -> pd.DataFrame:
    """[steps] name, gpu_us, launches, median_kernel_us, span_us.

    anchor_us: [kernels] the time used to place each kernel in a step - its own start for GPU-side
    ranges, its launch's CPU time for CPU-side ProfilerStep ranges (the GPU may run behind the CPU).
    """
    cols = ["name", "gpu_us", "launches", "median_kernel_us", "span_us"]
    if ranges.empty or kernels.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c == "name" else float) for c in cols})
    starts = ranges["start_us"].to_numpy()
    ends = ranges["end_us"].to_numpy()
    idx = np.searchsorted(starts, anchor_us, side="right") - 1
    inside = (idx >= 0) & (anchor_us <= ends[np.clip(idx, 0, None)])
    dur = kernels["dur_us"].to_numpy()
    ts = kernels["ts_us"].to_numpy()
    frame = pd.DataFrame({"step": idx[inside], "dur": dur[inside], "ts": ts[inside], "end": ts[inside] + dur[inside]})
    g = frame.groupby("step")
    out = pd.DataFrame({
        "gpu_us": g["dur"].sum(),
        "launches": g["dur"].size(),
        "median_kernel_us": g["dur"].median(),
        "span_us": g["end"].max() - g["ts"].min(),
    }).reindex(range(len(ranges)))
    out["launches"] = out["launches"].fillna(0).astype(np.int64)
    out["gpu_us"] = out["gpu_us"].fillna(0.0)
    out.insert(0, "name", ranges["name"].to_numpy())
    return out.reset_index(drop=True)[cols]


def steps_summary(source: str, table: pd.DataFrame, kernels_dur_in_steps: np.ndarray) -> dict | None:
    """The profile's `steps` field, or None when no steps were found."""
    if table.empty:
        return None
    from dsv4opt.analysis.rank import records

    return {
        "source": source,
        "count": int(len(table)),
        "gpu_us_per_step": float(table["gpu_us"].mean()),
        "launches_per_step": float(table["launches"].mean()),
        "median_kernel_us": float(np.median(kernels_dur_in_steps)) if len(kernels_dur_in_steps) else None,
        "steps": records(table),
    }
