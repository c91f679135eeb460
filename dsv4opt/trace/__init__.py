"""The one chrome-trace reader: trace files -> typed kernel/launch/operator tables.

read_trace and Trace load pandas, so they are imported on first use: naming the files and the pass
over the events (files.py, columns.py) must not pull the analysis stack in.
"""

from dsv4opt.trace.columns import GPU_CATS
from dsv4opt.trace.files import expand_trace_paths, rank_from_name


def __getattr__(name):
    if name == "read_trace":
        from dsv4opt.trace.reader import read_trace

        return read_trace
    if name == "Trace":
        from dsv4opt.trace.model import Trace

        return Trace
    raise AttributeError(name)


__all__ = ["GPU_CATS", "Trace", "expand_trace_paths", "rank_from_name", "read_trace"]
