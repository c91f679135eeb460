"""Shared test setup: Triton's interpreter on a CPU, seeded RNG, NaN-poisoned torch.empty,
isolated project state."""

from __future__ import annotations

import os

import pytest
import torch

from dsv4opt.numerics import nan_poisoned_allocations

# Triton decides interpreter or compiler when a kernel is defined, i.e. when a module is first
# imported: set it before any test module imports dsv4opt, so every kernel in this process is
# interpreted on a machine without a GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# ... and define the model's kernels now, under that setting: a module first imported inside a test
# that switches the interpreter off (the `torch_path` fixture) would otherwise keep compiled kernels
# for the rest of the session, whatever order the tests run in.
import dsv4opt.workload.baseline  # noqa: E402,F401  (the paths' slot implementations, loaded lazily)
import dsv4opt.workload.model  # noqa: E402,F401

# Under pytest-xdist (the README's test command runs `-n auto`), each worker takes its share of the
# cores: torch's default of one thread per core in every worker oversubscribes the machine.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

_empty = torch.empty  # the unpoisoned allocators, for tests that count launches
_empty_like = torch.empty_like


@pytest.fixture(autouse=True)
def poison_empty():
    """An output element a kernel forgot to write stays NaN and fails the comparison."""
    with nan_poisoned_allocations():
        yield


@pytest.fixture
def torch_path(monkeypatch):
    """The workload's plain-torch kernels (what a CPU runs outside the interpreter): for tests of
    whole-model runs, which the interpreter would take minutes over. The kernels themselves are
    tested under the interpreter in tests/workload/test_kernels.py."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.fixture(autouse=True)
def terminal_width(monkeypatch):
    """Every test sees an 80-column terminal, whatever the shell running the suite has: the consoles
    read COLUMNS when they print (a test that wants another width passes its own to the runner)."""
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    """No test reads or writes the developer's .dsv4opt/state.json."""
    monkeypatch.setenv("DSV4OPT_STATE", str(tmp_path / "state" / "state.json"))
    from dsv4opt.optimizations.registry import OPTIMIZATIONS

    for gate in (o.env_gate for o in OPTIMIZATIONS.values()):
        monkeypatch.delenv(gate, raising=False)

