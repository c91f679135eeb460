"""Atomic writes: a reader never sees a half-written file and an old file survives a crash."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes, make_dirs: bool = True, executable: bool = False) -> Path:
    """Write `data` to `path` atomically, with the permissions a plain open() would give (mkstemp's
    are 0600), plus the execute bits for a script. make_dirs=False refuses a missing folder instead
    of creating it (a user's --out)."""
    path = Path(path)
    if make_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        from dsv4opt.errors import DsvOptError

        raise DsvOptError(f"{path}: folder {path.parent} does not exist; create it first or choose another path")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, (0o777 if executable else 0o666) & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        # KeyboardInterrupt included: leave no temporary file behind.
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str, make_dirs: bool = True, executable: bool = False) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"), make_dirs, executable)


def write_json_atomic(path: str | os.PathLike, obj) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=False, allow_nan=False) + "\n")


def unique_path(path: str | os.PathLike) -> Path:
    """`path` if free, else `stem-2.ext`, `stem-3.ext`, ...: two outputs never overwrite each other."""
    path = Path(path)
    if not path.exists():
        return path
    suffix = "".join(path.suffixes)
    stem = path.name[: len(path.name) - len(suffix)] if suffix else path.name
    n = 2
    while True:
        candidate = path.with_name(f"{stem}-{n}{suffix}")
        if not candidate.exists():
            return candidate
        n += 1
