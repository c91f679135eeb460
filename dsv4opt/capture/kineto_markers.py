"""Keep the profiler's noise off the user's terminal, and everything else on it.

Kineto (torch.profiler's C++ tracer) writes a `USDT:<time> <pid>:<tid> File.cpp:52] profiler_start`
line to the process's stderr when a trace starts and stops. Its log levels put these markers above
ERROR (VERBOSE 0 .. ERROR 4, USDT 5), so KINETO_LOG_LEVEL cannot drop them without dropping errors
too. Instead, while a profiler runs, file descriptor 2 is a pipe whose lines are copied to the real
stderr, less the ones that start with the marker prefix.

torch.profiler also warns "Profiler clears events at the end of each cycle" on every capture (torch
2.11 on a GPU): a capture profiles one cycle by design, so that one warning is dropped, by its text.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Iterator

MARKER = b"USDT:"
# The start of torch.profiler's warning when a schedule starts a new cycle without acc_events.
CYCLE_WARNING = "Warning: Profiler clears events at the end of each cycle"


def _forward(read_fd: int, write_fd: int) -> None:
    """Copy read_fd to write_fd until EOF, leaving out lines that start with MARKER. Text that
    cannot be a marker is passed on at once, newline or not (a progress bar redraws without one)."""
    pending = b""
    while chunk := os.read(read_fd, 65536):
        pending += chunk
        out = []
        while (end := pending.find(b"\n")) >= 0:
            line, pending = pending[: end + 1], pending[end + 1:]
            if not line.startswith(MARKER):
                out.append(line)
        if pending and not (pending.startswith(MARKER) or MARKER.startswith(pending)):
            out.append(pending)
            pending = b""
        if out:
            os.write(write_fd, b"".join(out))
    if pending and not pending.startswith(MARKER):
        os.write(write_fd, pending)


@contextmanager
def without_kineto_markers() -> Iterator[None]:
    """Inside: Kineto's USDT marker lines on stderr are dropped, every other byte gets through."""
    try:
        stderr_fd = sys.__stderr__.fileno() if sys.__stderr__ is not None else 2
    except (AttributeError, OSError, ValueError):
        stderr_fd = 2
    for stream in (sys.stderr, sys.__stderr__):
        if stream is not None:
            stream.flush()
    saved = os.dup(stderr_fd)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, stderr_fd)
    os.close(write_fd)
    forwarder = threading.Thread(target=_forward, args=(read_fd, saved), name="kineto-markers", daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        for stream in (sys.stderr, sys.__stderr__):
            if stream is not None:
                stream.flush()
        os.dup2(saved, stderr_fd)  # closes the pipe's last write end: the forwarder reads EOF
        forwarder.join()
        os.close(read_fd)
        os.close(saved)


@contextmanager
def quiet_profiler() -> Iterator[None]:
    """Around a torch.profiler run: Kineto's markers and the one per-cycle warning kept off the
    terminal; every other line and warning gets through."""
    with warnings.catch_warnings(), without_kineto_markers():
        warnings.filterwarnings("ignore", message=CYCLE_WARNING, category=UserWarning)
        yield
