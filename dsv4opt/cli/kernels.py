"""`dsv4opt build-kernels`: fetch and compile SGLang 0.5.23's Hopper kernels into the kernel cache."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4opt.cli import app


@app.command("build-kernels")
def build_kernels(
    only: Annotated[Optional[str], typer.Option(help="Comma-separated families to build: deep_gemm, marlin, mhc (default: all).")] = None,
    tilelang_python: Annotated[Optional[str], typer.Option(help="A Python with tilelang==0.1.12, for the mHC cubins (default: $DSV4OPT_TILELANG_PYTHON, else a venv the build makes in the cache once, reusing this Python's torch).")] = None,
    wheels: Annotated[Optional[Path], typer.Option(help="A folder holding the wheels (vllm 0.23.0, sglang 0.5.23, apache-tvm-ffi 0.1.11 cp312), instead of downloading them.")] = None,
    pack: Annotated[Optional[Path], typer.Option(help="Then write every built family into this .tar.gz, for a machine without the network.")] = None,
    status: Annotated[bool, typer.Option("--status", help="Only say which families run SGLang's kernel here and why the others do not.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Rebuild families already built, and replace an existing --pack file.")] = False,
) -> None:
    """Build SGLang 0.5.23's DeepGEMM, Marlin MoE and TileLang mHC kernels into the kernel cache
    ($DSV4OPT_KERNEL_CACHE, else ~/.cache/dsv4opt/sglang-0.5.23), saying how long each step took.

    \b
    Example:
      dsv4opt build-kernels --tilelang-python ~/tl/bin/python --pack .prod/sglang-0.5.23-kernels.tar.gz
    """
    from dsv4opt.fileio import check_new_file
    from dsv4opt.workload.production import artefacts
    from dsv4opt.workload.production.build import build_kernels as build, pack as write_pack

    if not status:
        check_new_file(pack, force, "--pack")
        families = [f.strip() for f in only.split(",") if f.strip()] if only else None
        build(families, wheels=wheels, tilelang_python=tilelang_python, force=force, say=typer.echo)
        if pack is not None:
            typer.echo(f"wrote {write_pack(pack, force=force)}")
    typer.echo(f"kernel cache: {artefacts.cache_dir()}")
    for line in artefacts.status_lines():
        typer.echo(f"  {line}")
