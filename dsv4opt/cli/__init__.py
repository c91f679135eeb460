"""Thin typer commands: parse options, call one library function, render.

Only this package turns a DsvOptError into a red one-line message and exit code 1; the group below
does it for every command, so typer's test runner sees exactly what a user sees.

Its modules do without `from __future__ import annotations`: typer builds every command on each run
and would evaluate their annotations from strings, twice each (10 ms of every command).
"""

import gc
import os
import re
import sys
from contextlib import contextmanager
from enum import Enum

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from dsv4opt.errors import DsvOptError



# Spaces at a line's end (before any closing style codes): rich pads table cells and wrapped prose to
# their width, which a copied or diffed output carries as trailing spaces.
_TRAILING = re.compile(r"[ ]+((?:\x1b\[[0-9;]*m)*)$", re.MULTILINE)


class _Console(Console):
    def _render_buffer(self, buffer) -> str:  # rich's one place where segments become text
        return _TRAILING.sub(r"\1", super()._render_buffer(buffer))


def _console(**options) -> Console:
    """A console that reads its width (the terminal's, or COLUMNS) each time it prints: rich fixes
    COLUMNS at construction, i.e. when this module is imported, so a test runner's or a resized
    terminal's width would be ignored. Its lines end without trailing spaces."""
    out = _Console(**options)
    out.width = None  # type: ignore[assignment]  # rich's own "not fixed": measured on each print
    return out


console = _console()
err_console = _console(stderr=True)


class _Group(TyperGroup):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DsvOptError as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]: earlier state and outputs were left as they were")
            raise typer.Exit(130) from None


app = typer.Typer(
    name="dsv4opt",
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


# Options with a fixed set of values: typer checks them and --help lists them.
class Target(str, Enum):
    embedded = "embedded"
    sglang = "sglang"


class KvLayout(str, Enum):
    fp8 = "fp8"
    bf16 = "bf16"


class ReportFormat(str, Enum):
    html = "html"
    md = "md"


# --device also takes one GPU by number, so it is checked where the device is picked; --help shows
# its values all the same.
DEVICE_METAVAR = "[cuda|cpu|cuda:N]"


def _version(value: bool) -> None:
    if value:
        from dsv4opt import __version__

        typer.echo(f"dsv4opt {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Profile LLM decode, find the bottleneck, apply the fix, prove it moved.

    \b
    Example, the loop on the embedded DeepSeek-V4-Flash workload:
      dsv4opt profile -c 32
      dsv4opt recommend
      dsv4opt apply mma-attn
      dsv4opt report BEFORE.json AFTER.json --out report.html
    """


# Each module adds its commands to `app`; imported for that side effect.
from dsv4opt.cli import analyze as _analyze  # noqa: E402,F401
from dsv4opt.cli import profile as _profile  # noqa: E402,F401
from dsv4opt.cli import bench as _bench  # noqa: E402,F401
from dsv4opt.cli import glue as _glue  # noqa: E402,F401
from dsv4opt.cli import loop as _loop  # noqa: E402,F401
from dsv4opt.cli import sglang as _sglang  # noqa: E402,F401
from dsv4opt.cli import kernels as _kernels  # noqa: E402,F401


# True once main() runs: this process is one command and ends with it.
_one_shot = False
# The reading helper main() started from the raw command line (cli/analyze.py: prefetch_from_argv),
# until the command takes it.
early_prefetch = None


@contextmanager
def heavy_imports(uses_blas: bool = True):
    """Wraps a command's imports of pandas and the like. In a one-command process everything
    imported lives until exit, so the cyclic collector is kept off while they load (importing
    pandas runs it ~150 times) and what they built is then moved out of its reach: it stops
    rescanning pandas' and numpy's objects during the work, and interpreter shutdown skips them
    (0.1 s of a 55 MB analyze); the exit reclaims them all the same. A command that makes no BLAS
    call (uses_blas=False) loads numpy with one OpenBLAS thread, unless the user chose a number:
    its worker threads spin for ~0.1 s of CPU after loading, taken from the work on a busy machine.

    Only for commands that load no extension with a leak check at exit (nanobind's, in triton,
    reports what shutdown did not free), and not in a long-lived caller (tests, notebooks), where
    freezing would keep its garbage cycles forever."""
    if not _one_shot:
        yield
        return
    if not uses_blas and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


@contextmanager
def collector_off():
    """Wraps a command's work after its heavy imports. In a one-command process the cyclic collector
    stays off until the work is done, then is restored: what `analyze` builds holds few cycles (the
    same peak memory on the 55 and 504 MB benchmark traces without it) and its collections took 5-8%
    of the time. A no-op in a long-lived caller."""
    if not _one_shot or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def main() -> None:
    global _one_shot, early_prefetch
    _one_shot = True
    early_prefetch = _analyze.prefetch_from_argv(sys.argv[1:])
    try:
        app()
    finally:
        if early_prefetch is not None:  # the command did not take it: typer refused the options
            early_prefetch.close()
