"""Profile file names that say what they are, and never collide."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from dsv4opt.fileio import unique_path

PROFILES_DIR = Path("profiles")


def profile_path(
    target: str, config: str | None, concurrency: int | None, optimizations: list[str],
    out_dir: Path = PROFILES_DIR, ranks: int = 1,
) -> Path:
    """profiles/{target}-{config}-c{C}[-r{ranks}]-{baseline|opt+opt}-{YYYYmmdd-HHMMSS}.json, made unique."""
    parts = [target]
    if config:
        parts.append(config)
    if concurrency is not None:
        parts.append(f"c{concurrency}")
    if ranks > 1:
        parts.append(f"r{ranks}")
    parts.append("+".join(optimizations) if optimizations else "baseline")
    parts.append(dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    return unique_path(Path(out_dir) / ("-".join(parts) + ".json"))
