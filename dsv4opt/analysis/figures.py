"""One rank's timeline and efficiency tables from its trace, and the merge of several ranks'.

The glue between a Trace and the plain table functions of timeline.py and efficiency.py: which
step, device and stream each GPU event belongs to, and which operator call launched it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dsv4opt.analysis import efficiency, timeline
from dsv4opt.analysis.attribute import Attributor
from dsv4opt.analysis.devices import peak_of
from dsv4opt.trace.model import Trace

_SUMS = ["launches", "modelled_us", "flop", "bytes", "flop_at_peak_us", "bytes_at_peak_us"]


@dataclass
class RankFigures:
    devices: pd.DataFrame  # timeline.DEVICE_COLUMNS
    streams: pd.DataFrame  # timeline.STREAM_COLUMNS
    categories: pd.DataFrame  # timeline.CATEGORY_COLUMNS
    efficiency: pd.DataFrame  # efficiency.EFFICIENCY_COLUMNS


def rank_figures(trace: Trace, launches: pd.DataFrame, attributor: Attributor, step: np.ndarray,
                 category: np.ndarray) -> RankFigures:
    """step: [GPU events] the step each belongs to (-1 outside every step; all 0 when the trace has
    no steps: the whole trace is one window); category: [GPU events] its category."""
    k = trace.kernels
    events = pd.DataFrame({"step": np.asarray(step, np.int64), "device": device_labels(trace),
                           "stream": stream_labels(trace), "category": category,
                           "ts_us": k["ts_us"].to_numpy(), "dur_us": k["dur_us"].to_numpy()})
    rows = attributor.operator_rows(launches["external_id"].to_numpy(), launches["launch_pid"].to_numpy(),
                                    launches["launch_tid"].to_numpy(), launches["launch_ts_us"].to_numpy())
    eff = efficiency.kernel_efficiency(k.assign(category=category), rows, trace.cpu_ops, peak_of(trace.device))
    return RankFigures(timeline.device_busy(events), timeline.stream_busy(events), timeline.category_overlap(events), eff)


def device_labels(trace: Trace) -> np.ndarray:
    """[GPU events] the device as a label: args.device, else the event's process as written."""
    k = trace.kernels
    raw = np.array([str(p) for p in trace.threads], object) if trace.threads else np.zeros(0, object)
    dev = k["device"].to_numpy()
    out = raw[k["pid"].to_numpy()] if len(raw) else np.zeros(len(k), object)
    known = dev >= 0
    out = out.astype(object)
    out[known] = dev[known].astype(str)
    return out


def stream_labels(trace: Trace) -> np.ndarray:
    """[GPU events] the stream as written in the trace (Kineto puts it in the event's tid)."""
    raw = np.array([str(t) for t in trace.threads], object) if trace.threads else np.zeros(0, object)
    return raw[trace.kernels["tid"].to_numpy()] if len(raw) else np.zeros(len(trace.kernels), object)


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
