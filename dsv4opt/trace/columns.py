"""The reader's pass over the events: one chrome trace -> append-only columns per event kind.

No numpy or pandas here: the pass runs before the analysis stack is imported, in a helper process
when `dsv4opt analyze` prefetches (trace/prefetch.py), and reader.py turns its columns into tables.
GPU work is exactly the events with ph "X" and cat kernel / gpu_memcpy / gpu_memset; their raw
`dur` values are kept as float64 microseconds (no rounding to whole microseconds). CPU events that
merely carry a `stream` argument are not GPU work.
"""

from __future__ import annotations

import gc
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4opt.errors import TraceError
from dsv4opt.trace.stream import Args, Event, stream_trace

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
ANNOTATION_CATS = ("user_annotation", "gpu_user_annotation")
# Header keys worth keeping (small); the rest of the top-level object is dropped after parsing.
HEADER_KEYS = ("schemaVersion", "deviceProperties", "distributedInfo", "with_stack", "traceName",
               "cuda_runtime_version", "hip_runtime_version", "cupti_version", "roctracer_version",
               "host_name", "baseTimeNanoseconds")  # the last two say where and when: ranks of one run?
_NUMBER = frozenset((int, float))
# Set lookups for the per-event tests (the public tuples above stay tuples).
_GPU, _LAUNCH, _ANNOTATION = frozenset(GPU_CATS), frozenset(LAUNCH_CATS), frozenset(ANNOTATION_CATS)
_KEPT_CATS = ("python_function", "cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "gpu_user_annotation")


class Columns:
    """Append-only columns for one event kind: float64 and int64 arrays, strings as int64 codes
    into the trace's vocabulary."""

    def __init__(self, floats: tuple[str, ...], ints: tuple[str, ...], strings: tuple[str, ...]):
        self.floats = {k: array("d") for k in floats}
        self.ints = {k: array("q") for k in ints}
        self.strings = {k: array("q") for k in strings}


class _Codes(dict):
    """value -> small int code, assigned on first sight; lookups stay in C, only a new value calls
    back into Python."""

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self)
        return code


class _Vocab(dict):
    """string -> code into `strings` (interned once); None reads as "", other values as their text."""

    def __init__(self) -> None:
        super().__init__({"": 0})
        self.strings: list[str] = [""]

    def __missing__(self, key: Any) -> int:
        if not isinstance(key, str):
            return self["" if key is None else str(key)]  # not kept under the non-string key
        code = self[key] = len(self.strings)
        self.strings.append(key)
        return code


@dataclass
class TraceColumns:
    """One trace file's events as columns (what reader.py makes tables of); plain data, picklable."""

    path: Path
    header: dict[str, Any]
    kernels: Columns  # ts_us dur_us | pid tid correlation external_id device | name cat
    launches: Columns  # ts_us dur_us | pid tid correlation external_id | name kernel
    cpu_ops: Columns  # ts_us dur_us | pid tid external_id shape_code | name
    frames: Columns  # ts_us dur_us | pid tid | name
    annotations: Columns  # ts_us dur_us | pid tid on_gpu | name
    flows: Columns  # ts_us | pid tid flow_id
    vocab: list[str]  # string codes -> text
    threads: list[Any]  # pid/tid codes -> the raw pid/tid
    shapes: list[tuple[bytes, bytes, bytes]]  # shape_code -> (Input Dims, Input type, Concrete Inputs) JSON text
    process_names: dict[Any, str]
    event_count: int
    skipped_events: int


def read_columns(path: str | Path, shapes_of: frozenset[str] = frozenset()) -> TraceColumns:
    """One pass over a trace file's events into columns. Ids that are absent are stored as -1;
    pid/tid are interned to small ints. An operator named in `shapes_of` whose event carries "Input
    Dims" (record_shapes) gets a shape code, the others -1."""
    path = Path(path)
    intern = _Vocab()
    threads = _Codes()

    kernels = Columns(("ts_us", "dur_us"), ("pid", "tid", "correlation", "external_id", "device"), ("name", "cat"))
    launches = Columns(("ts_us", "dur_us"), ("pid", "tid", "correlation", "external_id"), ("name", "kernel"))
    cpu_ops = Columns(("ts_us", "dur_us"), ("pid", "tid", "external_id", "shape_code"), ("name",))
    frames = Columns(("ts_us", "dur_us"), ("pid", "tid"), ("name",))
    annotations = Columns(("ts_us", "dur_us"), ("pid", "tid", "on_gpu"), ("name",))
    flows = Columns(("ts_us",), ("pid", "tid", "flow_id"), ())
    process_names: dict[Any, str] = {}
    counts = {"events": 0, "skipped": 0}

    def binder(cols: Columns, ints: tuple[str, ...] = (), strings: tuple[str, ...] = ()):
        """Bound append methods for one table, in a fixed order, so the hot path makes no dict lookups."""
        return (cols.floats["ts_us"].append, cols.floats["dur_us"].append, cols.ints["pid"].append,
                cols.ints["tid"].append, cols.strings["name"].append,
                *(cols.ints[k].append for k in ints), *(cols.strings[k].append for k in strings))

    k_ts, k_dur, k_pid, k_tid, k_name, k_corr, k_ext, k_dev, k_cat = binder(kernels, ("correlation", "external_id", "device"), ("cat",))
    f_ts, f_dur, f_pid, f_tid, f_name = binder(frames)
    o_ts, o_dur, o_pid, o_tid, o_name, o_ext = binder(cpu_ops, ("external_id",))
    o_shape = cpu_ops.ints["shape_code"].append
    # Recorded shapes, each distinct one kept once as its JSON text: most calls repeat a few shapes,
    # and holding every call's nested lists would cost more than reading them.
    shape_codes = _Codes()
    l_ts, l_dur, l_pid, l_tid, l_name, l_corr, l_ext, l_kernel = binder(launches, ("correlation", "external_id"), ("kernel",))
    a_ts, a_dur, a_pid, a_tid, a_name, a_gpu = binder(annotations, ("on_gpu",))
    fl_ts, fl_pid, fl_tid, fl_id = (flows.floats["ts_us"].append, flows.ints["pid"].append,
                                    flows.ints["tid"].append, flows.ints["flow_id"].append)
    no_args = Args()

    def on_events(events: list[Event]) -> None:
        first = counts["events"]
        counts["events"] += len(events)
        for e in events:
            ph = e.ph
            if ph == "X":
                cat, ts, dur = e.cat, e.ts, e.dur
                if cat in _GPU:
                    name = e.name
                    if not isinstance(name, str) or type(ts) not in _NUMBER or type(dur) not in _NUMBER or dur < 0:
                        index = first + next(i for i, x in enumerate(events) if x is e)
                        raise TraceError(
                            f"{path}: event #{index} ({cat}) is corrupt: needs a string name and numeric "
                            f"ts and dur >= 0, got name={str(name)[:40]!r} ts={ts!r} dur={dur!r}"
                        )
                    args = e.args or no_args
                    k_ts(ts), k_dur(dur), k_pid(threads[e.pid]), k_tid(threads[e.tid]), k_name(intern[name])
                    corr, ext, dev = args.correlation, args.external_id, args.device
                    k_corr(corr if type(corr) is int else -1), k_ext(ext if type(ext) is int else -1)
                    k_dev(dev if type(dev) is int else -1), k_cat(intern[cat])
                elif type(ts) not in _NUMBER or type(dur) not in _NUMBER:
                    # Non-GPU events only feed attribution; a malformed one is skipped, not fatal.
                    counts["skipped"] += cat in _KEPT_CATS
                elif cat == "python_function":
                    f_ts(ts), f_dur(dur), f_pid(threads[e.pid]), f_tid(threads[e.tid]), f_name(intern[e.name])
                elif cat == "cpu_op":
                    args = e.args or no_args
                    name = e.name
                    ext = args.external_id
                    o_ts(ts), o_dur(dur), o_pid(threads[e.pid]), o_tid(threads[e.tid]), o_name(intern[name])
                    o_ext(ext if type(ext) is int else -1)
                    if name in shapes_of and (dims := bytes(args.input_dims))[:1] == b"[":
                        o_shape(shape_codes[(dims, bytes(args.input_type), bytes(args.concrete_inputs))])
                    else:
                        o_shape(-1)
                elif cat in _LAUNCH:
                    args = e.args or no_args
                    corr, ext = args.correlation, args.external_id
                    l_ts(ts), l_dur(dur), l_pid(threads[e.pid]), l_tid(threads[e.tid]), l_name(intern[e.name])
                    l_corr(corr if type(corr) is int else -1), l_ext(ext if type(ext) is int else -1)
                    l_kernel(intern[args.kernel])
                elif cat in _ANNOTATION:
                    a_ts(ts), a_dur(dur), a_pid(threads[e.pid]), a_tid(threads[e.tid]), a_name(intern[e.name])
                    a_gpu(int(cat == "gpu_user_annotation"))
            elif ph == "f" and e.cat == "ac2g":
                ts = e.ts
                fid = e.id
                if type(ts) in _NUMBER:
                    fl_ts(ts), fl_pid(threads[e.pid]), fl_tid(threads[e.tid]), fl_id(fid if type(fid) is int else -1)
            elif ph == "M" and e.name == "process_name":
                if e.args is not None:
                    process_names[e.pid] = "" if e.args.name is None else str(e.args.name)

    # Events are acyclic and freed by reference counting as soon as they are handled; the cyclic
    # collector would only rescan the growing tables (about 20% of the read time on big traces).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        header = stream_trace(path, on_events)
    finally:
        if gc_was_enabled:
            gc.enable()
    by_code = [None] * len(threads)
    for raw, code in threads.items():
        by_code[code] = raw
    return TraceColumns(
        path=path, header={k: header[k] for k in HEADER_KEYS if k in header}, kernels=kernels, launches=launches,
        cpu_ops=cpu_ops, frames=frames, annotations=annotations, flows=flows, vocab=intern.strings, threads=by_code,
        shapes=list(shape_codes), process_names=process_names, event_count=counts["events"],
        skipped_events=counts["skipped"],
    )
