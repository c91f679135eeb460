"""A rich progress bar for the capture's progress callbacks (stderr, transient)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from dsv4opt.capture.result import Progress as CaptureProgress


class RichProgress(CaptureProgress):
    def __init__(self, progress: Progress, console: Console):
        self._progress, self._console = progress, console
        self._task = progress.add_task("starting", total=None)

    def stage(self, description: str, total: int | None) -> None:
        self._progress.update(self._task, description=description, total=total, completed=0)

    def advance(self) -> None:
        self._progress.advance(self._task)

    def note(self, text: str) -> None:
        self._console.print(f"[yellow]{text}[/]")


@contextmanager
def rich_progress(console: Console | None = None) -> Iterator[RichProgress]:
    console = console or Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        yield RichProgress(progress, console)
