"""`dsv4opt sglang-switches NAME`: the SGLang env + launch flags that apply an optimisation there."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4opt.cli import app


@app.command("sglang-switches")
def sglang_switches(
    name: Annotated[str, typer.Argument(help="Optimisation to map onto SGLang (see `dsv4opt list`).")],
    out: Annotated[Path, typer.Option(help="Directory for sglang-NAME.env, sglang-NAME.flags and, with a drop-in, sglang-NAME-launch.sh.")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Replace files of those names that hold something else.")] = False,
    sglang_version: Annotated[Optional[str], typer.Option(help="The server's SGLang version (default: the one installed here).")] = None,
) -> None:
    """Write the SGLang environment, launch flags and drop-in launcher for NAME, and say what to restart.

    \b
    Example:
      dsv4opt sglang-switches mma-attn --out deploy/ --sglang-version 0.5.23
    """
    from dsv4opt.optimizations.registry import get

    get(name)  # a typo is refused here, before the SGLang tables load torch
    from dsv4opt.capture.sglang import apply_to_sglang, sglang_summary

    paths = apply_to_sglang(name, out, force=force, sglang_version=sglang_version)
    for path in paths:
        typer.echo(f"wrote {path}")
    typer.echo(sglang_summary(name, sglang_version))
