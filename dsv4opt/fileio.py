"""Atomic writes: a reader never sees a half-written file and an old file survives a crash."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from dsv4opt.errors import DsvOptError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _missing_folder(path: Path, option: str) -> DsvOptError:
    return DsvOptError(f"{path}: folder {path.parent} does not exist; create it first or choose another {option}")


def check_new_file(path: str | os.PathLike | None, force: bool, option: str) -> None:
    """The one policy for a file a user names (--out, --json): an existing file is refused unless
    `force`, and a missing folder is refused, never created (it is more often a typo than a wish).
    Called before any work is done, so a refusal costs nothing."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise DsvOptError(f"{path} is a folder; give {option} a file name")
    if path.exists() and not force:
        raise DsvOptError(f"{path} already exists; pass --force to replace it, or choose another {option}")
    if not path.parent.is_dir():
        raise _missing_folder(path, option)


def make_output_folder(path: str | os.PathLike | None, option: str) -> None:
    """A folder a user names for dsv4opt's files (--out-dir, --trace-dir, sglang's --out): it must
    exist, as the folder of a file a user names must (check_new_file): a missing one is refused,
    never created. The files dsv4opt puts there get names that are free."""
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DsvOptError(f"{path} is a file; give {option} a folder")
    if not path.exists():
        if not path.parent.is_dir():
            raise _missing_folder(path, option)
        raise DsvOptError(f"folder {path} does not exist; create it first or choose another {option}")


def write_bytes_atomic(path: str | os.PathLike, data: bytes, make_dirs: bool = True, executable: bool = False) -> Path:
    """Write `data` to `path` atomically, with the permissions a plain open() would give (mkstemp's
    are 0600), plus the execute bits for a script. make_dirs=False refuses a missing folder instead
    of creating it (a user's --out)."""
    path = Path(path)
    if make_dirs:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise _missing_folder(path, "path")
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


def write_json_atomic(path: str | os.PathLike, obj, make_dirs: bool = True) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=False, allow_nan=False) + "\n", make_dirs)


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


def finite(obj):
    """JSON has no NaN/inf: write them as null rather than producing invalid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
