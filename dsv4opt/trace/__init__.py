"""The one chrome-trace reader: trace files -> typed kernel/launch/operator tables."""

from dsv4opt.trace.files import expand_trace_paths, rank_from_name
from dsv4opt.trace.model import Trace
from dsv4opt.trace.reader import GPU_CATS, read_trace

__all__ = ["GPU_CATS", "Trace", "expand_trace_paths", "rank_from_name", "read_trace"]
