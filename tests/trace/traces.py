"""Real traces the trace/analysis tests run on, and independent plain-json expectations."""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path

from tests.helpers import DATA, shared_traces

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def real_traces() -> list[Path]:
    """../shared/traces (when present) plus the project's own fixtures tests/data/*.json.gz."""
    return shared_traces() + sorted(DATA.glob("*.json.gz"))


def ids(paths: list[Path]) -> list[str]:
    return [p.name.split(".")[0] for p in paths]


def plain_gpu_sums(path: Path) -> tuple[float, dict[str, float], dict[str, int]]:
    """Independent expectation: json.load + fsum of raw dur over ph X events in the GPU categories."""
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    per_name: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            per_name[e["name"]].append(e["dur"])
    total = math.fsum(d for v in per_name.values() for d in v)
    return total, {n: math.fsum(v) for n, v in per_name.items()}, {n: len(v) for n, v in per_name.items()}


def gpu_events(path: Path) -> list[dict]:
    """The GPU events of a trace as plain json.load gives them."""
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
