"""The per-rank trace files an SGLang server writes, and waiting until they are complete.

SGLang names them `[{prefix}-]{profile_id}-TP-{tp}[-DP-{dp}][-PP-{pp}][-EP-{ep}][-{STAGE}].trace.json.gz`
(STAGE is EXTEND/DECODE, or prefill/decode in the newer profiler, only with profile_by_stage) and
writes them in place with torch's export_chrome_trace, so a file can be seen half-written: a file
counts as complete only when its gzip stream decodes to the end and its size stopped changing.
`merged-{id}.trace.json.gz` (all ranks merged) is skipped: it would count every kernel twice.
"""

from __future__ import annotations

import asyncio
import gzip
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dsv4opt.errors import CaptureError
from dsv4opt.trace.files import SGLANG_TRACE_NAME

_NAME = SGLANG_TRACE_NAME
_DECODE = {"DECODE", "FORWARDMODE.DECODE"}
_PREFILL = {"EXTEND", "PREFILL", "MIXED", "FORWARDMODE.EXTEND", "FORWARDMODE.MIXED"}


@dataclass(frozen=True)
class TraceFile:
    path: Path
    profile_id: str
    tp: int
    dp: int | None = None
    pp: int | None = None
    ep: int | None = None
    stage: str | None = None  # "decode", "prefill", or None when SGLang did not split by stage

    @property
    def rank(self) -> str:
        parts = [f"TP{self.tp}"] + [f"{k.upper()}{v}" for k, v in (("dp", self.dp), ("pp", self.pp), ("ep", self.ep)) if v is not None]
        return "-".join(parts)


def parse_trace_name(path: Path) -> TraceFile | None:
    """The rank and stage a file name encodes, or None for files that are not rank traces."""
    path = Path(path)
    if path.name.startswith("merged-"):
        return None
    m = _NAME.match(path.name)
    if m is None:
        return None
    stage = m["stage"]
    if stage is not None:
        upper = stage.upper()
        stage = "decode" if upper in _DECODE else "prefill" if upper in _PREFILL else None
        if stage is None:
            return None  # e.g. "-memory" snapshots
    as_int = lambda s: int(s) if s is not None else None  # noqa: E731
    return TraceFile(path, m["profile_id"], int(m["tp"]), as_int(m["dp"]), as_int(m["pp"]), as_int(m["ep"]), stage)


def decode_traces(files: list[TraceFile]) -> list[TraceFile]:
    """Decode-stage files when the server split by stage; otherwise every rank file (all decode)."""
    staged = [f for f in files if f.stage is not None]
    if staged:
        return sorted((f for f in staged if f.stage == "decode"), key=lambda f: f.path.name)
    return sorted(files, key=lambda f: f.path.name)


def gzip_complete(path: Path) -> bool:
    """True when the whole gzip stream decodes (a file still being written ends early)."""
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 20):
                pass
        return True
    except (EOFError, OSError, zlib.error):
        return False


def list_rank_traces(run_dir: Path) -> list[TraceFile]:
    """Rank trace files in run_dir; [] when it does not exist yet (the server creates it)."""
    try:
        names = sorted(run_dir.iterdir())
    except FileNotFoundError:
        return []
    except PermissionError:
        raise CaptureError(
            f"trace directory {run_dir} exists but is not readable here (permission denied); "
            "make it readable to this user, or copy the *.trace.json.gz files and run `dsv4opt analyze DIR`"
        ) from None
    parsed = (parse_trace_name(p) for p in names if p.is_file())
    return [f for f in parsed if f is not None]


async def wait_for_traces(
    run_dir: Path,
    *,
    timeout_s: float,
    settle_s: float = 2.0,
    poll_s: float = 0.25,
    expected: int | None = None,
    check: Callable[[], None] = lambda: None,
) -> list[TraceFile]:
    """Wait until the rank traces in run_dir are complete; returns them (all stages).

    Complete: at least one file, every file's gzip decodes and its size held still over one poll,
    and either `expected` files are there or no new file appeared for settle_s. `check` runs every
    poll and may raise (the load generator reports its failures through it).
    """
    deadline = time.monotonic() + timeout_s
    sizes: dict[Path, int] = {}
    last_new = time.monotonic()
    files: list[TraceFile] = []
    while True:
        check()
        files = list_rank_traces(run_dir)
        now_sizes = {f.path: _size(f.path) for f in files}
        if set(now_sizes) - set(sizes):
            last_new = time.monotonic()
        steady = bool(files) and all(sizes.get(p) == s for p, s in now_sizes.items())
        sizes = now_sizes
        if steady and await asyncio.to_thread(lambda: all(gzip_complete(f.path) for f in files)):
            if (expected is not None and len(files) >= expected) or time.monotonic() - last_new >= settle_s:
                return files
        if time.monotonic() >= deadline:
            raise _timeout_error(run_dir, files, timeout_s)
        await asyncio.sleep(poll_s)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _timeout_error(run_dir: Path, files: list[TraceFile], timeout_s: float) -> CaptureError:
    if not run_dir.exists():
        return CaptureError(
            f"no trace appeared within {timeout_s:g} s: {run_dir} does not exist on this machine. "
            "If the server runs elsewhere or in a container, pass --trace-dir a path that both see "
            "(a shared mount), or copy the server's *.trace.json.gz files here and run `dsv4opt analyze DIR`"
        )
    if not files:
        return CaptureError(
            f"trace directory {run_dir} stayed empty for {timeout_s:g} s after /start_profile; check the "
            "server log for profiler errors, or raise --timeout if traces take longer to write"
        )
    pending = [f.path.name for f in files if not gzip_complete(f.path)]
    what = f"{', '.join(pending)} never finished writing" if pending else "more rank files kept appearing"
    return CaptureError(
        f"traces in {run_dir} incomplete after {timeout_s:g} s: {what}; the server may have crashed "
        "while exporting (check its log) or needs more time (--timeout)"
    )
