"""Glue regions: runs of glue kernels between heavy kernels, and what fusing each one would save.

A region is a maximal run of consecutive glue kernels (elementwise, reduction, copy, top-k/sort,
other) on one stream, inside one step and one model part, between heavy kernels (GEMM, attention,
MoE, communication). Glue launched by the same call as the heavy kernel next to it (a split-K
reduction by the same operator, an accumulator fill inside a kernel's wrapper) is that call's own
work and belongs to no region. Instances with the same key - model part and source sites when the
trace has Python stacks, else the operator chain, else the kernel names - are one piece of code
run once per layer and step, and are summed into one region.

Fused estimate of an instance: one launch taking max(launch floor, bytes / copy bandwidth where
operator shapes give the bytes, its longest hand-written kernel), never more than the instance
takes now; an instance of one launch has nothing to fuse. The launch floor is measured from the
trace (launch_floor_us). A hand-written kernel (Triton, TileLang, a library's) already does its
work in one launch: the estimate keeps it, and fuses only the eager launches around it.
Docs: docs/analysis.md (glue regions), the profile field in docs/profile-schema.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dsv4opt.analysis.categories import ATTENTION, COMMUNICATION, GEMM_FP32_SIMT, GEMM_TC, GLUE, MOE
from dsv4opt.analysis.codes import factorize_rows
from dsv4opt.analysis.profile import GlueRegionRow, GlueRegions
from dsv4opt.analysis.rank import records

HEAVY = (ATTENTION, GEMM_TC, GEMM_FP32_SIMT, MOE, COMMUNICATION)
# [launches] what glue_summary reads: stream code, times, category, step (-1 outside steps), part,
# site ('file.py:line function'), operator, the launching operator call (External id) and Python
# frame call (-1 unknown), short kernel name, hand-written (not an ATen eager kernel), bytes the
# launching operator moves (NaN unknown).
SEQ_COLUMNS = ["stream", "ts_us", "dur_us", "category", "step", "part", "site", "op", "op_call", "frame_call",
               "name", "handwritten", "bytes"]
REGION_COLUMNS = ["key", "part", "where", "ops", "kernels", "instances_per_step", "launches_per_step",
                  "gpu_us_per_step", "share", "median_kernel_us", "bytes_per_step", "fused_us_per_step",
                  "saving_us_per_step", "launches_saved_per_step", "estimate"]
FLOOR_FRACTION = 0.10  # the launch floor is the median of this fraction of the shortest kernels
MAX_REGIONS = 40  # regions a profile keeps (the rest summed in `rest`)
SEP = " · "

LAUNCH_FLOOR, BYTES, HANDWRITTEN, SINGLE = "launch floor", "bytes", "hand-written kernel", "one launch"


def launch_floor_us(dur_us: np.ndarray) -> float:
    """The median duration of the shortest FLOOR_FRACTION of kernels (at least one): what one launch
    that does little costs on this device, measured in this trace. 0 for no kernels."""
    d = np.sort(np.asarray(dur_us, float))
    if d.size == 0:
        return 0.0
    return float(np.median(d[: max(1, int(d.size * FLOOR_FRACTION))]))


def _in_heavy_calls(heavy: np.ndarray, op_call: np.ndarray, frame_call: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """[rows, stream order] glue launched by the same call as an adjacent heavy kernel: the same
    operator call when the heavy kernel has one (ATen), else the same Python frame call (a
    hand-written kernel's wrapper); every kernel between them must belong to that call too."""

    def after(heavy, op_call, frame_call, segment):
        idx = np.arange(len(heavy))
        last = np.maximum.accumulate(np.where(heavy, idx, -1))
        h = np.maximum(last, 0)
        by_op = op_call[h] >= 0
        same_call = np.where(by_op, op_call == op_call[h], (frame_call[h] >= 0) & (frame_call == frame_call[h]))
        match = (last >= 0) & ~heavy & (segment == segment[h]) & same_call
        broken = np.cumsum(~match & ~heavy)
        return match & (broken == broken[h])

    fwd = after(heavy, op_call, frame_call, segment)
    rev = after(heavy[::-1], op_call[::-1], frame_call[::-1], segment[::-1])[::-1]
    return fwd | rev


def assign_regions(seq: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """[launches] region instance of each glue launch (-1: none) and whether it was launched inside a
    heavy kernel's call, in seq's row order."""
    n = len(seq)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    order = np.lexsort((seq["ts_us"].to_numpy(), seq["stream"].to_numpy()))
    s = seq.iloc[order]
    cat = s["category"].to_numpy()
    step = s["step"].to_numpy()
    stream = s["stream"].to_numpy()
    part = pd.Series(s["part"].to_numpy(), dtype=object).fillna("").to_numpy()
    heavy = np.isin(cat, HEAVY)
    glue = np.isin(cat, GLUE) & (step >= 0)
    segment = factorize_rows(stream, step)
    inside = _in_heavy_calls(heavy, s["op_call"].to_numpy(np.int64), s["frame_call"].to_numpy(np.int64), segment)
    member = glue & ~inside
    same_as_prev = np.zeros(n, bool)
    same_as_prev[1:] = member[:-1] & (segment[1:] == segment[:-1]) & (part[1:] == part[:-1])
    start = member & ~same_as_prev
    instance = np.where(member, np.cumsum(start) - 1, -1)
    out_instance = np.empty(n, np.int64)
    out_instance[order] = instance
    out_inside = np.empty(n, bool)
    out_inside[order] = inside & glue
    return out_instance, out_inside


def _joined(keys: np.ndarray, values: pd.Series) -> pd.Series:
    """Per key: its distinct non-empty values in order of first appearance, joined by SEP."""
    # a plain loop: a pandas groupby with a Python aggregation builds a Series per group (0.14 s of
    # a 55 MB trace's analysis for the four columns, against 0.02 s here; docs/benchmarks.md)
    seen: set = set()
    out: dict = {}
    for k, v in zip(np.asarray(keys).tolist(), values.fillna("").astype(str).tolist()):
        if v and (k, v) not in seen:
            seen.add((k, v))
            out.setdefault(k, []).append(v)
    return pd.Series({k: SEP.join(vs) for k, vs in out.items()}, dtype=object)


def region_table(seq: pd.DataFrame, instance: np.ndarray, steps: int, total_us: float, floor_us: float,
                 copy_gbps: float | None) -> pd.DataFrame:
    """[regions] REGION_COLUMNS, by saving_us_per_step descending; per-step figures over `steps`."""
    empty = pd.DataFrame({c: pd.Series(dtype=object if c in ("key", "part", "where", "ops", "kernels", "estimate")
                                       else float) for c in REGION_COLUMNS})
    rows = seq[instance >= 0]
    inst = instance[instance >= 0]
    if rows.empty:
        return empty
    label = rows["site"].where(rows["site"].notna(), rows["op"].where(rows["op"].notna(), rows["name"]))
    dur = rows["dur_us"].to_numpy()
    g = pd.DataFrame({"inst": inst, "dur": dur, "hand": np.where(rows["handwritten"].to_numpy(bool), dur, 0.0),
                      "bytes": rows["bytes"].to_numpy(float)}).groupby("inst", sort=True)
    per = pd.DataFrame({"gpu": g["dur"].sum(), "launches": g["dur"].size(), "hand": g["hand"].max(),
                        "bytes": g["bytes"].max()})
    per["part"] = _joined(inst, rows["part"]).reindex(per.index).fillna("")
    per["where"] = _joined(inst, label).reindex(per.index).fillna("")
    per["ops"] = _joined(inst, rows["op"]).reindex(per.index).fillna("")
    per["kernels"] = _joined(inst, rows["name"]).reindex(per.index).fillna("")
    per["key"] = per["part"] + " | " + per["where"]
    move = per["bytes"] / (copy_gbps * 1e3) if copy_gbps else pd.Series(np.nan, index=per.index)
    terms = pd.DataFrame({LAUNCH_FLOOR: np.full(len(per), floor_us), BYTES: move.fillna(0.0).to_numpy(),
                          HANDWRITTEN: per["hand"].to_numpy()}, index=per.index)
    fused = terms.max(axis=1).clip(upper=per["gpu"])
    basis = terms.idxmax(axis=1).where(per["launches"] > 1, SINGLE)
    per["fused"] = fused.where(per["launches"] > 1, per["gpu"])
    per["basis"] = basis
    k = per.groupby("key", sort=False)
    out = pd.DataFrame({
        "part": k["part"].first(), "where": k["where"].first(), "ops": k["ops"].first(), "kernels": k["kernels"].first(),
        "instances": k["gpu"].size(), "launches": k["launches"].sum(), "gpu": k["gpu"].sum(),
        "bytes": k["bytes"].sum(min_count=1).where(k["bytes"].count() == k["gpu"].size()),
        "fused": k["fused"].sum(), "estimate": k["basis"].agg(lambda b: b.value_counts().index[0]),
    })
    row_key = per["key"].reindex(inst).to_numpy()
    out["median_kernel_us"] = pd.Series(dur).groupby(row_key).median().reindex(out.index)
    out = out.reset_index()
    n = max(1, steps)
    table = pd.DataFrame({
        "key": out["key"], "part": out["part"], "where": out["where"], "ops": out["ops"], "kernels": out["kernels"],
        "instances_per_step": out["instances"] / n, "launches_per_step": out["launches"] / n,
        "gpu_us_per_step": out["gpu"] / n, "share": out["gpu"] / total_us if total_us > 0 else 0.0,
        "median_kernel_us": out["median_kernel_us"], "bytes_per_step": out["bytes"] / n,
        "fused_us_per_step": out["fused"] / n, "saving_us_per_step": (out["gpu"] - out["fused"]) / n,
        "launches_saved_per_step": (out["launches"] - out["instances"]) / n, "estimate": out["estimate"],
    })
    table = table.sort_values(["saving_us_per_step", "key"], ascending=[False, True], kind="mergesort")
    return table.reset_index(drop=True)[REGION_COLUMNS]


def glue_summary(seq: pd.DataFrame, total_us: float, steps: int, copy_gbps: float | None = None,
                 keep: int = MAX_REGIONS, rank: int | None = None) -> GlueRegions:
    """Regions of `seq` (SEQ_COLUMNS) ranked by what fusing would save, with how they were found."""
    kernels = seq[seq["dur_us"].notna()]
    floor = launch_floor_us(kernels["dur_us"].to_numpy())
    instance, inside = assign_regions(seq)
    bytes_known = bool(np.isfinite(seq["bytes"].to_numpy(float)).any()) and copy_gbps is not None
    table = region_table(seq, instance, steps, total_us, floor, copy_gbps if bytes_known else None)
    n = max(1, steps)
    in_steps = seq["step"].to_numpy() >= 0
    glue = np.isin(seq["category"].to_numpy(), GLUE) & in_steps
    dur = seq["dur_us"].to_numpy()
    has_site = bool(seq.loc[glue, "site"].notna().any())
    has_op = bool(seq.loc[glue, "op"].notna().any())
    keyed_by = "source sites" if has_site else ("operators" if has_op else "kernel names")
    notes = []
    if not has_site and has_op:
        notes.append("the trace has no Python stacks: regions are keyed by their operator chains; a trace "
                     "recorded with Python stacks (torch.profiler's with_stack=True; the embedded capture's eager reference step is) keys them by source line")
    elif not has_site:
        notes.append("the glue kernels carry no operator (CUDA-graph replays without a reference): regions are keyed by "
                     "kernel names; pass the eager or capture trace with --capture for operators, parts and source lines")
    if not seq.loc[glue, "part"].notna().any():
        notes.append("no model-part ranges (record_function) in the trace: regions are not split by part")
    if not bytes_known:
        notes.append("the trace records no operator shapes (record_shapes), so no bytes: each region is estimated at one "
                     "launch at the launch floor, an optimistic bound for regions that move much data")
    rest = table.iloc[keep:]
    return GlueRegions(
        regions=[GlueRegionRow(**row) for row in _records(table.iloc[:keep])], steps=n, launch_floor_us=floor,
        floor_from=f"median of the shortest {FLOOR_FRACTION:.0%} of the trace's {len(kernels)} kernels",
        copy_gbps=copy_gbps if bytes_known else None, bytes_known=bytes_known, keyed_by=keyed_by,
        glue_launches_per_step=float(glue.sum()) / n, glue_us_per_step=float(dur[glue].sum()) / n,
        glue_share=float(dur[glue].sum()) / total_us if total_us > 0 else 0.0,
        step_us=float(dur[in_steps].sum()) / n, saving_us_per_step=float(table["saving_us_per_step"].sum()),
        in_heavy_calls={"launches_per_step": float(inside.sum()) / n, "gpu_us_per_step": float(dur[inside].sum()) / n},
        rest={"regions": float(len(rest)), "launches_per_step": float(rest["launches_per_step"].sum()),
              "gpu_us_per_step": float(rest["gpu_us_per_step"].sum()),
              "saving_us_per_step": float(rest["saving_us_per_step"].sum())},
        notes=notes, rank=rank,
    )


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-ready rows, a missing figure (NaN) as None."""
    return records(table.astype(object).where(table.notna(), None))
