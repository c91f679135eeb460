"""Project state: which optimisations are applied and which profile came last.

Lives in .dsv4opt/state.json under the working directory; written atomically, so an interrupted
command leaves the previous state as it was.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dsv4opt.errors import StateError
from dsv4opt.fileio import unique_path, write_json_atomic

STATE_SCHEMA = "dsv4opt.state/1"


def state_path() -> Path:
    return Path(os.environ.get("DSV4OPT_STATE", ".dsv4opt/state.json"))


@dataclass
class State:
    enabled: list[str] = field(default_factory=list)
    last_profile: str | None = None
    history: list[dict] = field(default_factory=list)  # {"action", "name", "profile", "date"}
    checks: dict[str, dict] = field(default_factory=dict)  # name -> {"passed", "device", "date"}


def load_state(path: Path | None = None) -> State:
    path = path or state_path()
    if not path.exists():
        return State()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
            raise ValueError("unknown schema")
        enabled = data.get("enabled", [])
        if not isinstance(enabled, list) or not all(isinstance(n, str) for n in enabled):
            raise ValueError("'enabled' is not a list of names")
        return State(
            enabled=list(enabled),
            last_profile=data.get("last_profile"),
            history=list(data.get("history", [])),
            checks=dict(data.get("checks", {})),
        )
    except (OSError, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise StateError(
            f"{path}: project state is corrupt ({exc}); run `dsv4opt status --reset` to start afresh"
        ) from None


def save_state(state: State, path: Path | None = None) -> Path:
    return write_json_atomic(path or state_path(), {"schema": STATE_SCHEMA, **asdict(state)})


def reset_state(path: Path | None = None) -> Path | None:
    """Set the state file aside (never deleted: it may hold the only record) and start afresh."""
    path = path or state_path()
    if not path.exists():
        return None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    kept = unique_path(path.with_name(f"{path.name}.bak-{stamp}"))
    os.replace(path, kept)
    return kept
