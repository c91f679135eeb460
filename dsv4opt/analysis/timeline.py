"""GPU busy, idle and overlap time per step: the union of kernel intervals, not their sum.

A plain sum of kernel durations counts twice the time two streams run together (communication
under compute, two-batch overlap) and says nothing of the gaps between kernels. Here, per step and
device: busy = the union of its kernel intervals, idle = the step's GPU span minus busy, overlap =
the time at least two streams are busy; per stream the same against the device's span; per
category the time it is busy, the part of that when no other category runs (exposed) and the rest
(overlapped). The exact sums stay where they were (kernel tables, steps' gpu_us).

Input everywhere: [GPU events] step (int; rows with step < 0 are left out), device, stream,
category, ts_us, dur_us.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STREAM_COLUMNS = ["step", "device", "stream", "launches", "kernel_us", "busy_us", "idle_us"]
DEVICE_COLUMNS = ["step", "device", "streams", "launches", "kernel_us", "span_us", "busy_us", "idle_us", "overlap_us"]
CATEGORY_COLUMNS = ["step", "device", "category", "kernel_us", "busy_us", "exposed_us", "overlapped_us"]


def stream_busy(events: pd.DataFrame) -> pd.DataFrame:
    """[step x device x stream] launches, kernel_us (plain sum), busy_us (union), idle_us (the
    device's span in that step minus this stream's busy time)."""
    ev, labels = _in_steps(events)
    if ev.empty:
        return _empty(STREAM_COLUMNS, ("device", "stream"))
    keys = ["step", "device", "stream"]
    merged = _merged(ev, keys)
    out = ev.groupby(keys, sort=True).agg(launches=("dur_us", "size"), kernel_us=("dur_us", "sum"))
    out["busy_us"] = (merged["end"] - merged["start"]).groupby([merged[k] for k in keys]).sum()
    span = _span(ev, ["step", "device"])
    out["idle_us"] = span.reindex(out.index.droplevel("stream")).to_numpy() - out["busy_us"].to_numpy()
    return _labelled(out.reset_index(), labels)[STREAM_COLUMNS]


def device_busy(events: pd.DataFrame) -> pd.DataFrame:
    """[step x device] streams, launches, kernel_us (plain sum), span_us (first start to last end),
    busy_us (union over streams), idle_us, overlap_us (time with at least two streams busy)."""
    ev, labels = _in_steps(events)
    if ev.empty:
        return _empty(DEVICE_COLUMNS, ("device",))
    keys = ["step", "device"]
    out = ev.groupby(keys, sort=True).agg(streams=("stream", "nunique"), launches=("dur_us", "size"),
                                          kernel_us=("dur_us", "sum"))
    out["span_us"] = _span(ev, keys)
    merged = _merged(ev, keys)
    out["busy_us"] = (merged["end"] - merged["start"]).groupby([merged[k] for k in keys]).sum()
    out["idle_us"] = out["span_us"] - out["busy_us"]
    per_stream = _merged(ev, keys + ["stream"])
    active, _, seg_us, seg_key = _sweep(per_stream, keys, label=None)
    overlap = pd.Series(np.where(active >= 2, seg_us, 0.0)).groupby([seg_key[k] for k in keys]).sum()
    out["overlap_us"] = overlap.reindex(out.index, fill_value=0.0).to_numpy()
    return _labelled(out.reset_index(), labels)[DEVICE_COLUMNS]


def category_overlap(events: pd.DataFrame) -> pd.DataFrame:
    """[step x device x category] kernel_us (plain sum), busy_us (union of its kernels), exposed_us
    (busy while no other category runs on the device), overlapped_us (busy_us - exposed_us)."""
    ev, labels = _in_steps(events)
    if ev.empty:
        return _empty(CATEGORY_COLUMNS, ("device", "category"))
    keys = ["step", "device", "category"]
    out = ev.groupby(keys, sort=True).agg(kernel_us=("dur_us", "sum"))
    merged = _merged(ev, keys)
    out["busy_us"] = (merged["end"] - merged["start"]).groupby([merged[k] for k in keys]).sum()
    active, only, seg_us, seg_key = _sweep(merged, ["step", "device"], label="category")
    alone = active == 1
    exposed = pd.Series(seg_us[alone]).groupby([seg_key["step"][alone], seg_key["device"][alone], only[alone]]).sum()
    out["exposed_us"] = exposed.reindex(out.index, fill_value=0.0).to_numpy()
    out["overlapped_us"] = out["busy_us"] - out["exposed_us"]
    return _labelled(out.reset_index(), labels)[CATEGORY_COLUMNS]


def _in_steps(events: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """The events inside steps, with end_us, and device/stream/category as small int codes (group-bys
    on ints are several times faster than on strings); the labels to map them back."""
    ev = events[events["step"].to_numpy() >= 0]
    ts = ev["ts_us"].to_numpy(np.float64)
    # Times from the first start: an end computed as start + dur on epoch microseconds (~1e12) is
    # rounded to 1e-4 us, which summed over thousands of kernels shows; from a nearby origin it is not.
    cols = {"step": ev["step"].to_numpy(np.int64), "ts_us": ts - ts.min() if len(ts) else ts}
    cols["end_us"] = cols["ts_us"] + ev["dur_us"].to_numpy(np.float64)
    cols["dur_us"] = ev["dur_us"].to_numpy(np.float64)
    labels = {}
    for c in ("device", "stream", "category"):
        cols[c], uniques = pd.factorize(ev[c], sort=True)  # a categorical factorizes by its codes
        labels[c] = np.asarray(uniques, dtype=object)
    return pd.DataFrame(cols), labels


def _labelled(out: pd.DataFrame, labels: dict[str, np.ndarray]) -> pd.DataFrame:
    for c, names in labels.items():
        if c in out:
            out[c] = names[out[c].to_numpy()]
    return out


def _span(ev: pd.DataFrame, keys: list[str]) -> pd.Series:
    g = ev.groupby(keys, sort=True)
    return g["end_us"].max() - g["ts_us"].min()


def _merged(ev: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The union of the intervals of each key group as disjoint [start, end] rows (touching
    intervals merge), with the key columns."""
    ev = ev.sort_values(keys + ["ts_us"], kind="mergesort")
    start, end = ev["ts_us"].to_numpy(), ev["end_us"].to_numpy()
    group = ev.groupby(keys, sort=False).ngroup().to_numpy()
    # The latest end so far in the group, before this interval: a gap to it starts a new run.
    reach = pd.Series(end).groupby(group).cummax().to_numpy()
    new_group = np.r_[True, group[1:] != group[:-1]]
    begins = np.flatnonzero(new_group | (start > np.r_[-np.inf, reach[:-1]]))
    out = {k: ev[k].to_numpy()[begins] for k in keys}
    out["start"] = start[begins]
    out["end"] = np.maximum.reduceat(end, begins)
    return pd.DataFrame(out)


def _sweep(merged: pd.DataFrame, keys: list[str], label: str | None):
    """Sweep the disjoint-per-label intervals of each key group: for every elementary segment
    between consecutive interval edges, how many intervals are active, which label when exactly
    one is (label codes must be >= 0), its length and its key columns."""
    n = len(merged)
    t = np.concatenate([merged["start"].to_numpy(), merged["end"].to_numpy()])
    delta = np.r_[np.ones(n, np.int64), -np.ones(n, np.int64)]
    tag = np.zeros(2 * n, np.int64) if label is None else np.tile(merged[label].to_numpy().astype(np.int64) + 1, 2)
    key_cols = {k: np.tile(merged[k].to_numpy(), 2) for k in keys}
    group = pd.DataFrame(key_cols).groupby(keys, sort=False).ngroup().to_numpy()
    # At equal times an interval ends before the next begins, so touching intervals never overlap.
    order = np.lexsort((delta, t, group))
    t, delta, tag, group = t[order], delta[order], tag[order], group[order]
    active = np.cumsum(delta)
    only = np.cumsum(delta * tag) - 1
    same = np.r_[group[1:] == group[:-1], False]
    seg_us = np.where(same, np.r_[t[1:] - t[:-1], 0.0], 0.0)
    seg_key = {k: v[order] for k, v in key_cols.items()}
    return active, only, seg_us, seg_key


def _empty(columns: list[str], text: tuple[str, ...]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object if c in text else (np.int64 if c in ("step", "launches", "streams") else float))
                         for c in columns})
