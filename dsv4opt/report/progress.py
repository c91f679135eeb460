"""A rich progress display for the capture's and the loop's progress callbacks (stderr, transient)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dsv4opt.capture.result import Progress as CaptureProgress


class RichProgress(CaptureProgress):
    """A line for the current stage and, once several runs are announced, one above it for the
    runs done of the total."""

    def __init__(self, progress: Progress, console: Console):
        self._progress, self._console = progress, console
        self._runs = progress.add_task("runs", total=None, visible=False)  # drawn first: added first
        self._task = progress.add_task("starting", total=None)

    def runs(self, done: int, total: int, next_label: str | None) -> None:
        what = f"runs, next: {escape(next_label)}" if next_label else "runs"
        self._progress.update(self._runs, description=what, total=total, completed=done, visible=True)

    def stage(self, description: str, total: int | None) -> None:
        self._progress.update(self._task, description=escape(description), total=total, completed=0)

    def advance(self) -> None:
        self._progress.advance(self._task)

    def note(self, text: str) -> None:
        self._console.print(f"[yellow]{escape(text)}[/]")


@contextmanager
def rich_progress(console: Console | None = None) -> Iterator[RichProgress]:
    console = console or Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        yield RichProgress(progress, console)
