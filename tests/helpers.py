"""Paths and markers the tests share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SHARED_TRACES = REPO.parent / "shared" / "traces"


def shared_traces() -> list[Path]:
    """Real traces written by other projects; empty on a fresh clone without ../shared."""
    return sorted(SHARED_TRACES.glob("*.json*")) if SHARED_TRACES.is_dir() else []


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
