"""Read one chrome trace into typed columnar tables (the only place that knows the event format).

The pass over the events is columns.py's (no numpy or pandas, so it can run before they are
imported); here its columns become the typed pandas tables of a Trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import numpy as np
import pandas as pd

from dsv4opt.trace.columns import GPU_CATS, Columns, TraceColumns, read_columns
from dsv4opt.trace.model import Trace

__all__ = ["GPU_CATS", "OpShapes", "read_trace", "trace_of"]


class OpShapes(NamedTuple):
    """What record_shapes wrote for one operator call, as in the file: per input its dims (a list of
    ints, [] for a scalar, a list of those for a TensorList), its type ("c10::BFloat16", "Scalar",
    ...) and its value when concrete ("" otherwise)."""

    dims: list
    types: list
    concrete: list


def read_trace(path: str | Path, rank: int | None = None, shapes_of: frozenset[str] = frozenset()) -> Trace:
    """Parse one trace file into a Trace (tables: kernels, launches, cpu_ops, frames, annotations).

    Ids that are absent are stored as -1. pid/tid are interned to small ints (`Trace.threads` maps
    back). cpu_ops' `shapes` column holds an OpShapes for the operators named in `shapes_of` whose
    event carries "Input Dims" (traces recorded with record_shapes), else None.
    """
    return trace_of(read_columns(path, shapes_of), rank)


def trace_of(cols: TraceColumns, rank: int | None = None) -> Trace:
    """The Trace of a file's columns (columns.read_columns)."""
    vocab = cols.vocab
    ops_table = _frame(cols.cpu_ops, vocab)
    distinct = np.empty(len(cols.shapes) + 1, dtype=object)  # the last entry: no shapes recorded
    decode = msgspec.json.decode
    distinct[:-1] = [OpShapes(decode(d), decode(t) or [], decode(c) or []) for d, t, c in cols.shapes]
    ops_table["shapes"] = distinct[ops_table.pop("shape_code").to_numpy()]
    kernel_table = _frame(cols.kernels, vocab)
    _fill_correlation_from_flows(kernel_table, _frame(cols.flows, vocab))
    return Trace(
        path=cols.path,
        rank=rank,
        header=cols.header,
        kernels=kernel_table,
        launches=_frame(cols.launches, vocab),
        cpu_ops=ops_table,
        frames=_frame(cols.frames, vocab),
        annotations=_frame(cols.annotations, vocab),
        threads=cols.threads,
        process_names=cols.process_names,
        event_count=cols.event_count,
        skipped_events=cols.skipped_events,
    )


def _frame(cols: Columns, vocab: list[str]) -> pd.DataFrame:
    """Strings as categoricals over the trace's vocabulary, numbers as float64/int64 columns (views of
    the arrays: the DataFrame copies them)."""
    out: dict[str, Any] = {}
    categories = pd.Index(vocab, dtype=object)
    for k, a in cols.strings.items():
        codes = np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, np.int64)
        out[k] = pd.Categorical.from_codes(codes.astype(np.int32), categories=categories)
    for k, a in cols.floats.items():
        out[k] = np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0, np.float64)
    for k, a in cols.ints.items():
        out[k] = np.frombuffer(a, dtype=np.int64) if len(a) else np.zeros(0, np.int64)
    return pd.DataFrame(out)


def _fill_correlation_from_flows(kernels: pd.DataFrame, flows: pd.DataFrame) -> None:
    """Kernels without args.correlation take it from the ac2g flow that ends on them (same place, same ts)."""
    missing = kernels["correlation"].to_numpy() < 0
    if not missing.any() or flows.empty:
        return
    key = pd.MultiIndex.from_arrays([flows["pid"], flows["tid"], flows["ts_us"]])
    ids = pd.Series(flows["flow_id"].to_numpy(), index=key)
    ids = ids[~ids.index.duplicated()]
    want = pd.MultiIndex.from_arrays(
        [kernels.loc[missing, "pid"], kernels.loc[missing, "tid"], kernels.loc[missing, "ts_us"]]
    )
    found = ids.reindex(want).fillna(-1).astype(np.int64).to_numpy()
    kernels.loc[missing, "correlation"] = found
