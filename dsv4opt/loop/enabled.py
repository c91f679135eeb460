"""Which optimisations a run uses: the project state, the env gates and the names asked for now."""

from __future__ import annotations

from typing import Iterable

from dsv4opt.optimizations.registry import OPTIMIZATIONS, env_enabled, get
from dsv4opt.state import load_state


def enabled_optimizations(extra: Iterable[str] = (), *, use_state: bool = True) -> list[str]:
    """Names switched on: applied in the project state, set by env gate, or asked for now.

    Validated and in registry order, so the same set always reads the same.
    """
    names = {get(name).name for name in extra}
    names.update(env_enabled())
    if use_state:
        names.update(load_state().enabled)
    return [n for n in OPTIMIZATIONS if n in names]
