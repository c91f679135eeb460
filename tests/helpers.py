"""Paths and markers the tests share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
FIXTURE_PROFILES = DATA / "profiles"  # saved profiles to read and render (tests/data/profiles/README.md)
EVIDENCE_PROFILES = REPO / "evidence" / "h200" / "profiles"  # the H200 profiles the docs quote
SHARED_TRACES = REPO.parent / "shared" / "traces"


def shared_traces() -> list[Path]:
    """Real traces written by other projects; empty on a fresh clone without ../shared."""
    return sorted(SHARED_TRACES.glob("*.json*")) if SHARED_TRACES.is_dir() else []


def merged_intervals(intervals) -> list[list[float]]:
    """Plain Python union of (start, end) pairs, for expected values of the interval analyses."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
