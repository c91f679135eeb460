"""Read trace files in a forked helper while `dsv4opt analyze` parses its options and imports the
analysis.

Parsing (typer imports pydantic) and importing numpy, pandas and the analysis take about as long as
the pass over a 50 MB trace's events, and that pass (columns.py) needs none of them, so a helper
forked from the raw command line (cli/analyze.py: prefetch_from_argv) reads meanwhile. Its columns
come back pickled through a pipe, one file at a time in the order asked, each table on its own so
the helper drops it as this process takes it.

Only a one-command process starts it, only while it runs one thread (forking a threaded process
can copy a held lock), with at least MIN_BYTES to read and a CPU left free by the rest of the
machine: the helper costs 0.1-0.17 s of CPU on the 55 MB benchmark trace, paid back in wall time
only when it runs beside this process (docs/analysis.md, "Speed against HTA"). Anything unexpected
(no fork, the helper dies, another file is asked for) and the caller reads the file itself, so the
output and the errors are those of reading in this process; a TraceError the helper met comes back
as the same message.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from pathlib import Path

from dsv4opt.errors import TraceError
from dsv4opt.trace.columns import TraceColumns, read_columns

_TABLES = ("kernels", "launches", "cpu_ops", "frames", "annotations", "flows")


# Below this (on disk, all files together) reading in process costs about what starting the helper
# does: a 0.2 MB gzip trace ran no faster with it (0.01 s slower, quartile of 12) and took 0.05 s
# more CPU; the 55 MB benchmark trace ran 0.1 s faster.
MIN_BYTES = 1 << 20
# CPUs minus the 1-minute load average must leave this much: on 2 cores with another job keeping
# one busy (load 3-4) the helper made the 55 MB trace 0.2 s slower instead of 0.1 s faster.
MIN_FREE_CPUS = 0.5


class Prefetch:
    """A helper process reading `paths`, in order, for `shapes_of` (columns.read_columns)."""

    def __init__(self, pid: int, fd: int, paths: list[Path], shapes_of: frozenset[str]):
        self._pid: int | None = pid
        self._pipe = open(fd, "rb")
        self._paths = paths
        self._shapes_of = shapes_of

    @classmethod
    def start(cls, paths: list[Path], shapes_of: frozenset[str]) -> Prefetch | None:
        """Fork the helper; None where this process cannot fork safely or it would not pay."""
        paths = [Path(p) for p in paths]
        if not hasattr(os, "fork") or threading.active_count() > 1 or _free_cpus() < MIN_FREE_CPUS:
            return None
        try:
            if sum(p.stat().st_size for p in paths) < MIN_BYTES:
                return None
        except OSError:
            return None
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return None
        if pid == 0:
            os.close(r)
            _serve(w, paths, shapes_of)
        os.close(w)
        return cls(pid, r, paths, shapes_of)

    def take(self, path: str | Path, shapes_of: frozenset[str]) -> TraceColumns | None:
        """The next file's columns when it is `path` read for `shapes_of`; None: read it yourself.
        Raises the TraceError the helper met reading it."""
        if self._pid is None or not self._paths or self._paths[0] != Path(path) or shapes_of != self._shapes_of:
            self.close()
            return None
        self._paths.pop(0)
        try:
            cols, error = pickle.load(self._pipe)
            if cols is not None:
                for table in _TABLES:
                    setattr(cols, table, pickle.load(self._pipe))
        except Exception:  # the helper died or wrote something else: no answer, whatever the reason
            self.close()
            return None
        if error is not None:
            self.close()
            raise TraceError(error)
        return cols

    def close(self) -> None:
        """Stop the helper (it may still be reading files no one will ask for) and reap it."""
        pid, self._pid = self._pid, None
        if pid is None:
            return
        self._pipe.close()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)


def _free_cpus() -> float:
    """The CPUs this process may run on, less the machine's 1-minute load average (which counts this
    process)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        cpus = os.cpu_count() or 1
    try:
        return cpus - os.getloadavg()[0]
    except OSError:  # no load average to read
        return cpus - 1.0


def _serve(fd: int, paths: list[Path], shapes_of: frozenset[str]) -> None:
    """The helper: per file (columns without their tables, None) then each table of _TABLES, or
    (None, TraceError message) and stop. A table is dropped once written, so the two processes
    never both hold all of a file's columns. It leaves by os._exit, whatever happens: no traceback,
    no atexit handler, no flushing of the output buffers it shares with its parent."""
    code = 1
    try:
        # Off the terminal and any pipe the caller reads to its end, should the helper outlive it.
        null = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1, 2):
            os.dup2(null, std)
        with open(fd, "wb") as out:
            for path in paths:
                try:
                    cols = read_columns(path, shapes_of)
                except TraceError as exc:
                    pickle.dump((None, str(exc)), out, protocol=pickle.HIGHEST_PROTOCOL)
                    break
                tables = {table: getattr(cols, table) for table in _TABLES}
                for table in _TABLES:
                    setattr(cols, table, None)
                pickle.dump((cols, None), out, protocol=pickle.HIGHEST_PROTOCOL)
                del cols
                for table in _TABLES:
                    pickle.dump(tables.pop(table), out, protocol=pickle.HIGHEST_PROTOCOL)
                    out.flush()
        code = 0
    finally:
        os._exit(code)
