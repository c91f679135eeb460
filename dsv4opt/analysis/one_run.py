"""Are these trace files the ranks of one run? Decided from what the traces say about themselves.

Several files are merged into one profile only when they could be the ranks of one run: the same
kind of device, one torch.distributed job (each file a different rank of the same world size), each
file its own process, profiled over the same stretch of time, and, when they are named as SGLang
names per-rank traces, one profile id, one stage and a different rank each. What cannot be told
from a file (no distributedInfo, no CPU events) is not held against it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dsv4opt.errors import TraceError
from dsv4opt.trace import Trace
from dsv4opt.trace.files import SGLANG_TRACE_NAME

# Ranks of one run profile the same steps; clocks of different hosts may disagree by this much.
CLOCK_SLACK_S = 60.0
APART = "`dsv4opt analyze` them one at a time, or `dsv4opt compare` two of them"


@dataclass(frozen=True)
class Origin:
    """Where and when one trace file was captured, as far as the file says."""

    file: str
    device: str | None
    host: str | None
    pid: Any  # the process of its CPU events; None without any
    rank: int | None  # torch.distributed rank (distributedInfo), None outside a job
    world_size: int | None
    start_s: float | None  # seconds since the epoch when the trace records its base time
    end_s: float | None


def origin_of(trace: Trace) -> Origin:
    header = trace.header
    info = header.get("distributedInfo") if isinstance(header.get("distributedInfo"), dict) else {}
    start, end = _span_us(trace)
    base = header.get("baseTimeNanoseconds")
    to_s = (lambda us: (base / 1e9) + us / 1e6) if isinstance(base, (int, float)) else (lambda us: us / 1e6)
    return Origin(
        file=Path(trace.path).name, device=trace.device, host=_str(header.get("host_name")), pid=_process(trace),
        rank=_int(info.get("rank")), world_size=_int(info.get("world_size")),
        start_s=to_s(start) if start is not None else None, end_s=to_s(end) if end is not None else None,
    )


def check_names(files: list[Path]) -> None:
    """Files named as SGLang names its per-rank traces must be one profile run, one stage, one file
    per rank; a folder mixing such files with others is refused."""
    if len(files) < 2:
        return
    parsed = [(f.name, SGLANG_TRACE_NAME.match(f.name)) for f in files]
    named = [(n, m) for n, m in parsed if m]
    if named and len(named) < len(files):
        other = next(n for n, m in parsed if not m)
        raise TraceError(f"{named[0][0]} is named as SGLang names a rank's trace and {other} is not: not ranks of "
                         f"one run; {APART}")
    if not named:
        return
    first_name, first = named[0]
    for name, m in named[1:]:
        if (m["prefix"], m["profile_id"]) != (first["prefix"], first["profile_id"]):
            raise TraceError(f"{first_name} and {name} are from different SGLang profile runs "
                             f"({first['profile_id']} and {m['profile_id']}): not ranks of one run; {APART}")
        if m["stage"] != first["stage"]:
            stages = " and ".join(s or "no stage" for s in (first["stage"], m["stage"]))
            raise TraceError(f"{first_name} and {name} hold different stages ({stages}): analyze one stage at a "
                             "time (the -DECODE files for decode)")
    seen: dict[tuple, str] = {}
    for name, m in named:
        rank = m.group("tp", "dp", "pp", "ep")
        if rank in seen:
            raise TraceError(f"{seen[rank]} and {name} are the same rank of one run: a run has one trace per rank")
        seen[rank] = name


class OneRun:
    """Origins added one by one; each must fit the run the earlier ones describe."""

    def __init__(self) -> None:
        self.origins: list[Origin] = []

    def add(self, o: Origin) -> None:
        for prev in self.origins:
            _check_pair(prev, o)
        self.origins.append(o)

    def describe(self) -> str | None:
        """What was merged, in one line (None for a single file)."""
        os_ = self.origins
        if len(os_) < 2:
            return None
        parts = [f"{len(os_)} traces merged as the ranks of one run"]
        ranks = [o.rank for o in os_ if o.rank is not None]
        if len(ranks) == len(os_):
            parts.append(f"torch.distributed ranks {', '.join(map(str, sorted(ranks)))} of {os_[0].world_size}")
        devices = sorted({o.device for o in os_ if o.device})
        if devices:
            parts.append(" and ".join(devices))
        hosts = sorted({o.host for o in os_ if o.host})
        if hosts:
            parts.append(("host " if len(hosts) == 1 else "hosts ") + ", ".join(hosts))
        starts = [o.start_s for o in os_ if o.start_s is not None]
        if len(starts) == len(os_):
            parts.append(f"started within {_seconds(max(starts) - min(starts))} of each other")
        unknown = [what for what, known in (("distributedInfo", ranks), ("a CPU process", [o.pid for o in os_ if o.pid is not None]))
                   if not known]
        if unknown:
            parts.append("the traces record no " + " and no ".join(unknown) + ", so only what they do record was checked")
        return "; ".join(parts)


def _check_pair(a: Origin, b: Origin) -> None:
    both = f"{a.file} and {b.file}"
    if a.device and b.device and a.device != b.device:
        raise TraceError(f"{a.file} ran on {a.device} and {b.file} on {b.device}: traces of different devices are "
                         f"not ranks of one run; {APART}")
    if (a.rank is None) != (b.rank is None):
        inside, outside = (a, b) if a.rank is not None else (b, a)
        raise TraceError(f"{inside.file} is rank {inside.rank} of a torch.distributed job and {outside.file} was "
                         f"profiled outside one: not ranks of one run; {APART}")
    if a.rank is not None:
        if a.world_size != b.world_size:
            raise TraceError(f"{a.file} is rank {a.rank} of {a.world_size} and {b.file} rank {b.rank} of "
                             f"{b.world_size}: different jobs, not ranks of one run; {APART}")
        if a.rank == b.rank:
            raise TraceError(f"{both} are both rank {a.rank} of {a.world_size}: two runs, not two ranks; {APART}")
    if a.pid is not None and a.pid == b.pid and a.host == b.host:
        where = f" on {a.host}" if a.host else ""
        raise TraceError(f"{both} come from one process (pid {a.pid}{where}): one rank profiled twice, not two "
                         "ranks (an eager step and its graph replay: `dsv4opt analyze` the replay with the eager trace as "
                         "--capture)")
    if None not in (a.start_s, a.end_s, b.start_s, b.end_s):
        gap = max(a.start_s, b.start_s) - min(a.end_s, b.end_s)
        if gap > CLOCK_SLACK_S:
            raise TraceError(f"{a.file} was captured at {_when(a.start_s)} and {b.file} at {_when(b.start_s)}, "
                             f"{_seconds(gap)} apart: ranks of one run are profiled together; {APART}")


def _span_us(trace: Trace) -> tuple[float | None, float | None]:
    starts, ends = [], []
    for table in (trace.kernels, trace.cpu_ops, trace.annotations):
        if len(table):
            ts, dur = table["ts_us"].to_numpy(), table["dur_us"].to_numpy()
            starts.append(float(ts.min()))
            ends.append(float(np.nanmax(ts + dur)))
    return (min(starts), max(ends)) if starts else (None, None)


def _process(trace: Trace) -> Any:
    """The OS process of the trace's CPU operators (the most common pid among them)."""
    for table in (trace.cpu_ops, trace.annotations):
        if len(table):
            codes = table["pid"].to_numpy()
            codes = codes[codes >= 0]
            if not len(codes):
                continue
            code = int(np.bincount(codes).argmax())
            return trace.threads[code] if 0 <= code < len(trace.threads) else None
    return None


def _int(x: Any) -> int | None:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _str(x: Any) -> str | None:
    return str(x) if isinstance(x, str) and x else None


def _seconds(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 3600:.1f} h" if s >= 7200 else f"{s / 60:.0f} min"


def _when(s: float) -> str:
    if s > 1e9:  # seconds since the epoch
        return dt.datetime.fromtimestamp(s, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{s:.1f} s on the trace's clock"
