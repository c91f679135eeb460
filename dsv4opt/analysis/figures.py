"""One rank's timeline and efficiency tables from its trace, the merge of several ranks', and the
profile fields they become.

The glue between a Trace and the plain table functions of timeline.py, efficiency.py and
spread.py: which step, device and stream each GPU event belongs to, which operator call launched it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dsv4opt.analysis import efficiency, timeline
from dsv4opt.analysis.attribute import Attributor
from dsv4opt.analysis.devices import peak_of
from dsv4opt.analysis.profile import (CategoryOverlapRow, DeviceBusyRow, DevicePeak, KernelEfficiency, StreamBusyRow,
                                      Timeline)
from dsv4opt.analysis.rank import records
from dsv4opt.analysis.spread import kernel_spread
from dsv4opt.trace.model import Trace

_SUMS = ["launches", "modelled_us", "rated_us", "flop", "bytes", "flop_at_peak_us", "bytes_at_peak_us"]


@dataclass
class RankFigures:
    devices: pd.DataFrame  # timeline.DEVICE_COLUMNS
    whole: pd.DataFrame  # timeline.DEVICE_COLUMNS of the whole trace, steps or not (step 0)
    streams: pd.DataFrame  # timeline.STREAM_COLUMNS
    categories: pd.DataFrame  # timeline.CATEGORY_COLUMNS
    efficiency: pd.DataFrame  # efficiency.EFFICIENCY_COLUMNS


@dataclass
class ReplayedOps:
    """For a graph replay analysed with an eager reference: the reference kernel each replayed
    kernel was matched to, and the reference's operator calls."""

    reference_kernel: np.ndarray  # [GPU events of the replay] row in the reference's kernels, -1 none
    reference_op_row: np.ndarray  # [reference kernels] row in reference_ops of its operator, -1 none
    reference_ops: pd.DataFrame  # the reference's cpu_ops (name, shapes)


def rank_figures(trace: Trace, launches: pd.DataFrame, attributor: Attributor, step: np.ndarray,
                 category_of: dict[str, str], replayed: ReplayedOps | None = None) -> RankFigures:
    """step: [GPU events] the step each belongs to (-1 outside every step; all 0 when the trace has
    no steps: the whole trace is one window); category_of: kernel name -> category. A replayed
    kernel matched to a reference kernel takes the reference's operator call for its efficiency,
    one call per graph launch."""
    k = trace.kernels
    category = event_categories(trace, category_of)
    events = pd.DataFrame({"step": np.asarray(step, np.int64), "device": device_labels(trace),
                           "stream": stream_labels(trace), "category": category,
                           "ts_us": k["ts_us"].to_numpy(), "dur_us": k["dur_us"].to_numpy()})
    rows = attributor.operator_rows(launches["external_id"].to_numpy(), launches["launch_pid"].to_numpy(),
                                    launches["launch_tid"].to_numpy(), launches["launch_ts_us"].to_numpy())
    ops, call = trace.cpu_ops[["name", "shapes"]], rows
    if replayed is not None:
        ref = replayed.reference_kernel
        ref_row = np.where(ref >= 0, replayed.reference_op_row[np.maximum(ref, 0)], -1)
        take = (rows < 0) & (ref_row >= 0)
        rows = np.where(take, len(ops) + ref_row, rows)
        ops = pd.concat([ops.astype({"name": object}), replayed.reference_ops[["name", "shapes"]].astype({"name": object})],
                        ignore_index=True)
        # The same captured call replayed by several graph launches is one call per launch.
        pair = pd.MultiIndex.from_arrays([np.where(take, k["correlation"].to_numpy(), -1), rows])
        call = np.where(rows >= 0, pd.factorize(pair)[0], -1)
    eff = efficiency.kernel_efficiency(k.assign(category=category), rows, ops, peak_of(trace.device), call=call)
    whole = timeline.device_busy(events.assign(step=0))
    return RankFigures(timeline.device_busy(events), whole, timeline.stream_busy(events),
                       timeline.category_overlap(events), eff)


def device_labels(trace: Trace) -> pd.Categorical:
    """[GPU events] the device as a label: args.device, else the event's process as written."""
    k = trace.kernels
    dev = k["device"].to_numpy()
    key = np.where(dev >= 0, dev, -1 - k["pid"].to_numpy())
    return _labelled(key, lambda x: str(x) if x >= 0 else str(trace.threads[-1 - x]))


def stream_labels(trace: Trace) -> pd.Categorical:
    """[GPU events] the stream as written in the trace (Kineto puts it in the event's tid)."""
    return _labelled(trace.kernels["tid"].to_numpy(), lambda x: str(trace.threads[x]))


def event_categories(trace: Trace, category_of: dict[str, str]) -> pd.Categorical:
    """[GPU events] each event's category, from its name's."""
    names = trace.kernels["name"]
    vocab = names.cat.categories
    return _labelled(names.cat.codes.to_numpy(), lambda code: category_of[vocab[code]])


def _labelled(keys: np.ndarray, label_of) -> pd.Categorical:
    """[events] int keys -> a categorical of their labels, each label made once per distinct key
    (labels as strings cost a hash per event to group by; a categorical groups by small codes)."""
    codes, distinct = pd.factorize(np.asarray(keys, np.int64))
    label_codes, labels = pd.factorize(np.array([label_of(x) for x in distinct], dtype=object))
    return pd.Categorical.from_codes(label_codes[codes] if len(codes) else codes, categories=pd.Index(labels, dtype=object))


def merge_efficiency(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Several ranks' efficiency tables as one: sums added, rates and fractions recomputed."""
    tables = [t for t in tables if not t.empty]
    if not tables:
        return efficiency.kernel_efficiency(pd.DataFrame(), np.zeros(0, np.int64), pd.DataFrame(), None)
    if len(tables) == 1:
        return tables[0]
    both = pd.concat(tables, ignore_index=True)
    g = both.groupby("name", sort=False)
    out = g[_SUMS].sum(min_count=1)
    out["op"] = g["op"].first()
    return efficiency.rates(out.reset_index())


def timeline_of(per_rank: list[tuple[int | None, RankFigures]]) -> Timeline | None:
    """The profile's timeline: every rank's rows (`rank` set when there are several)."""
    if not per_rank:
        return None
    several = len(per_rank) > 1

    def rows(row_type, table: pd.DataFrame, rank_id) -> list:
        extra = {"rank": rank_id} if several else {}
        return [row_type(**row, **extra) for row in records(table)]

    return Timeline(
        devices=[r for rank_id, f in per_rank for r in rows(DeviceBusyRow, f.devices, rank_id)],
        whole=[r for rank_id, f in per_rank for r in rows(DeviceBusyRow, f.whole, rank_id)],
        streams=[r for rank_id, f in per_rank for r in rows(StreamBusyRow, f.streams, rank_id)],
        categories=[r for rank_id, f in per_rank for r in rows(CategoryOverlapRow, f.categories, rank_id)],
    )


def steps_with_busy(steps: dict, figures: RankFigures) -> dict:
    """The steps summary with each step's busy, idle and overlap time (summed over the rank's
    devices: one per trace file as profilers write them) and their means per step."""
    per_step = figures.devices.groupby("step")[["busy_us", "idle_us", "overlap_us"]].sum()
    out = dict(steps)
    rows = []
    for i, row in enumerate(steps.get("steps") or []):
        row = dict(row)
        if i in per_step.index:
            row.update({k: float(v) for k, v in per_step.loc[i].items()})
        rows.append(row)
    out["steps"] = rows
    for key in ("busy_us", "idle_us", "overlap_us"):
        values = [r[key] for r in rows if key in r]
        if values:
            out[f"{key}_per_step"] = float(np.mean(values))
    return out


def kernel_fields(kernels: pd.DataFrame, eff: pd.DataFrame) -> dict[str, dict]:
    """name -> the KernelRow fields for its spread (all kernels) and efficiency (modelled ones)."""
    out: dict[str, dict] = {}
    for row in records(kernel_spread(kernels)):
        out[row.pop("name")] = row
    for row in records(eff):
        name = row["name"]
        out.setdefault(name, {})["efficiency"] = KernelEfficiency(
            op=row["op"], launches=int(row["launches"]), modelled_us=row["modelled_us"], tflops=row["tflops"],
            gbps=row["gbps"], compute_of_peak=_finite_or_none(row["compute_of_peak"]),
            bandwidth_of_peak=_finite_or_none(row["bandwidth_of_peak"]))
    return out


def peak_row(device: str | None) -> DevicePeak | None:
    peak = peak_of(device)
    if peak is None:
        return None
    return DevicePeak(label=peak.label, hbm_gbps=peak.hbm_gbps, tflops=dict(peak.tflops), source=peak.source)


def _finite_or_none(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None
