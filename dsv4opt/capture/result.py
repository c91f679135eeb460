"""What a capture hands on (traces and settings, nothing analysed), and how it reports progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Captured:
    """The raw result of one capture: trace files, what was run, what was measured, where it goes."""

    traces: list[Path]
    meta: dict[str, Any]
    throughput: dict[str, float] | None
    out: Path  # where the profile is to be written (not yet existing)
    capture_trace: Path | None = None  # an eager step's trace, for mapping graph-replayed kernels
    extra: dict[str, Any] = field(default_factory=dict)  # more Profile fields (load_metrics, run_dir)
    notes: list[str] = field(default_factory=list)  # what a person should be told


class Progress:
    """Progress callbacks a capture (and the loop around several) calls; the CLI renders them,
    tests and scripts ignore them."""

    def runs(self, done: int, total: int, next_label: str | None) -> None:
        """`done` of `total` runs (a sweep's profiles, list --check's gates) finished; the next is
        `next_label` (None when all are done)."""

    def stage(self, description: str, total: int | None) -> None:
        """A new stage of `total` steps (None: unknown)."""

    def advance(self) -> None:
        """One step of the current stage done."""

    def note(self, text: str) -> None:
        """Something a person should read now."""


no_progress = Progress()
