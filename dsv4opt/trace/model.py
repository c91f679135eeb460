"""The typed result of reading one trace file: columnar tables with units in column names."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd


@dataclass
class Trace:
    """One trace file (one rank).

    Tables (pandas, one row per event; ids absent in the trace are -1; pid/tid are codes into
    `threads`; names are categoricals):
      kernels     name, cat, ts_us, dur_us, pid, tid, correlation, external_id, device
      launches    CUDA/HIP runtime+driver calls: name, kernel (args.kernel, "" when absent), ts_us,
                  dur_us, pid, tid, correlation, external_id
      cpu_ops     name, ts_us, dur_us, pid, tid, external_id, shapes (reader.OpShapes or None; one object
                  per distinct recorded shape)
      frames      python_function events (with_stack=True): name "file.py(line): func", ts_us, dur_us, pid, tid
      annotations record_function / ProfilerStep ranges: name, ts_us, dur_us, pid, tid, on_gpu (0/1)
    """

    path: Path
    rank: int | None
    header: dict[str, Any]
    kernels: pd.DataFrame
    launches: pd.DataFrame
    cpu_ops: pd.DataFrame
    frames: pd.DataFrame
    annotations: pd.DataFrame
    threads: list[Any] = field(default_factory=list)
    process_names: dict[Any, str] = field(default_factory=dict)
    event_count: int = 0
    skipped_events: int = 0

    @property
    def device(self) -> str | None:
        props = self.header.get("deviceProperties")
        if isinstance(props, list) and props and isinstance(props[0], dict):
            name = props[0].get("name")
            return str(name) if name else None
        return None

    @property
    def gpu_time_us(self) -> float:
        return math.fsum(self.kernels["dur_us"].tolist())
