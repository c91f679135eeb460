"""Shared test setup: seeded RNG, NaN-poisoned torch.empty, isolated project state."""

from __future__ import annotations

import pytest
import torch

_empty = torch.empty
_empty_like = torch.empty_like


def _poison(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() and t.numel() and t.dtype.itemsize >= 2:
        t.fill_(float("nan"))
    return t


def _poisoned_empty(*args, **kwargs):
    return _poison(_empty(*args, **kwargs))


def _poisoned_empty_like(*args, **kwargs):
    return _poison(_empty_like(*args, **kwargs))


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    """An output element a kernel forgot to write stays NaN and fails the comparison."""
    monkeypatch.setattr(torch, "empty", _poisoned_empty)
    monkeypatch.setattr(torch, "empty_like", _poisoned_empty_like)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    """No test reads or writes the developer's .dsv4opt/state.json."""
    monkeypatch.setenv("DSV4OPT_STATE", str(tmp_path / "state" / "state.json"))
    for gate in ("DSV4OPT_MMA_ATTN", "DSV4OPT_BF16_GEMM"):
        monkeypatch.delenv(gate, raising=False)

