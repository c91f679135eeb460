"""Which files a user's TRACE arguments mean, and which rank each one is."""

from __future__ import annotations

import re
from pathlib import Path

from dsv4opt.errors import TraceError

TRACE_SUFFIXES = (".json", ".json.gz")
# SGLang names its traces [{prefix}-]{profile_id}-TP-{tp}[-DP-{dp}][-PP-{pp}][-EP-{ep}][-{STAGE}].trace.json.gz
SGLANG_RANK = r"-TP-(?P<tp>\d+)(?:-DP-(?P<dp>\d+))?(?:-PP-(?P<pp>\d+))?(?:-EP-(?P<ep>\d+))?"
SGLANG_TRACE_NAME = re.compile(
    r"^(?:(?P<prefix>.+)-)?(?P<profile_id>[^-]+)" + SGLANG_RANK + r"(?:-(?P<stage>[A-Za-z][A-Za-z_.]*))?\.trace\.json\.gz$"
)
_SGLANG_RANK = re.compile(SGLANG_RANK)


def is_trace_name(path: Path) -> bool:
    return path.name.endswith(TRACE_SUFFIXES)


def rank_from_name(name: str) -> int | None:
    """The TP rank in an SGLang trace file name, else None."""
    m = _SGLANG_RANK.search(name)
    return int(m.group("tp")) if m else None


def expand_trace_paths(paths: list[str | Path]) -> list[Path]:
    """Files for the given files/folders; a folder contributes its *.json / *.json.gz (one per rank)."""
    if not paths:
        raise TraceError("no trace given; pass a .json/.json.gz trace or a folder of them")
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.is_file() and is_trace_name(q))
            if not found:
                raise TraceError(f"{p}: folder holds no .json or .json.gz trace files")
            out += sorted(found, key=lambda q: (rank_from_name(q.name) is None, rank_from_name(q.name) or 0, q.name))
        elif p.exists():
            out.append(p)
        else:
            raise TraceError(f"{p}: no such file or folder")
    return out
