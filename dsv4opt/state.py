"""Project state: which optimisations are applied and which profile came last.

Lives in .dsv4opt/state.json of the project: the nearest folder, from the working directory up,
that has a .dsv4opt/ (as git finds .git), else the working directory. Written atomically, so an
interrupted command leaves the previous state as it was.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import msgspec

from dsv4opt.errors import StateError
from dsv4opt.fileio import unique_path, write_json_atomic
from dsv4opt.validate import convert, read_json

STATE_SCHEMA = "dsv4opt.state/1"
STATE_DIR = ".dsv4opt"
RESET_HINT = "run `dsv4opt status --reset` to start afresh (the old file is kept)"


def state_path() -> Path:
    """The state file, absolute: DSV4OPT_STATE when set, else the project's."""
    if os.environ.get("DSV4OPT_STATE"):
        return Path(os.environ["DSV4OPT_STATE"]).absolute()
    return project_root() / STATE_DIR / "state.json"


def project_root(start: Path | None = None) -> Path:
    """The nearest folder from `start` (the working directory) up holding a .dsv4opt/ folder; else
    `start` itself, where a first state file will be created."""
    start = (start or Path.cwd()).absolute()
    for folder in (start, *start.parents):
        if (folder / STATE_DIR).is_dir():
            return folder
    return start


class CheckVerdict(msgspec.Struct):
    """The latest run of an optimisation's gate."""

    passed: bool
    device: str
    date: str | None = None


class HistoryEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    action: str  # profile, apply, apply-declined, revert
    name: str | None = None  # the optimisation
    profile: str | None = None
    date: str | None = None


class State(msgspec.Struct, kw_only=True):
    enabled: list[str] = []
    last_profile: str | None = None
    history: list[HistoryEntry] = []
    checks: dict[str, CheckVerdict] = {}


def load_state(path: Path | None = None) -> State:
    path = path or state_path()
    if not path.exists():
        return State()
    data = read_json(path, StateError, "project state", hint=RESET_HINT)
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != STATE_SCHEMA:
        raise StateError(f"{path}: schema: expected {STATE_SCHEMA!r}, got {schema!r}; {RESET_HINT}")
    checks = data.get("checks")
    if isinstance(checks, dict):  # one by one, so a bad verdict is named by its optimisation
        for name, verdict in checks.items():
            convert(verdict, CheckVerdict, str(path), StateError, at=f"checks.{name}", hint=RESET_HINT)
    state = convert({k: v for k, v in data.items() if k != "schema"}, State, str(path), StateError, hint=RESET_HINT)
    # Paths recorded relative were relative to the project folder (where the state was written
    # from): make them absolute, so they hold from any subdirectory.
    root = path.parent.parent
    if state.last_profile is not None:
        state.last_profile = str(root / state.last_profile)
    for entry in state.history:
        if entry.profile is not None:
            entry.profile = str(root / entry.profile)
    return state


def save_state(state: State, path: Path | None = None) -> Path:
    return write_json_atomic(path or state_path(), {"schema": STATE_SCHEMA, **msgspec.to_builtins(state)})


def reset_state(path: Path | None = None) -> Path | None:
    """Set the state file aside (never deleted: it may hold the only record) and start afresh."""
    path = path or state_path()
    if not path.exists():
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    kept = unique_path(path.with_name(f"{path.name}.bak-{stamp}"))
    os.replace(path, kept)
    return kept
