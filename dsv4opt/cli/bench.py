"""`dsv4opt bench NAME`: an optimisation's micro-benchmark (check first, then timing)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4opt.cli import app, console
from dsv4opt.errors import DsvOptError

# name -> module with run_bench(batches=..., on_step=...) -> result, render(result) and result.as_json().
BENCHES = {"mma-attn": "dsv4opt.optimizations.mma_attn.bench"}


def _batches(text: Optional[str]) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise DsvOptError(f"--batch takes comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise DsvOptError(f"--batch takes comma-separated positive integers, got {text!r}")
    return values


@app.command()
def bench(
    name: Annotated[str, typer.Argument(help=f"Benchmark to run: {', '.join(BENCHES)}.")],
    batch: Annotated[Optional[str], typer.Option(help="Comma-separated batch sizes (default: the benchmark's).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the results as JSON here.")] = None,
    kv: Annotated[str, typer.Option(help="KV cache layout the benchmark reads: fp8 (SGLang's) or bf16.")] = "fp8",
) -> None:
    """Run an optimisation's correctness check, then time it against its floor and the baseline."""
    if name not in BENCHES:
        raise DsvOptError(f"unknown benchmark {name!r}; known: {', '.join(BENCHES)}")
    if json_out is not None and json_out.exists():
        raise DsvOptError(f"{json_out} already exists: choose another --json path or remove it")
    module = importlib.import_module(BENCHES[name])
    batches = _batches(batch)
    kwargs = {"batches": batches} if batches else {}
    kwargs["kv"] = kv
    with console.status(f"bench {name}") as status:
        result = module.run_bench(on_step=lambda msg: status.update(f"bench {name}: {msg}"), **kwargs)
    console.print(module.render(result))
    if json_out is not None:
        from dsv4opt.fileio import write_json_atomic

        write_json_atomic(json_out, result.as_json())
        console.print(f"wrote {json_out}")
    if not result.check.passed:
        raise DsvOptError(f"{name} failed its correctness check: {result.check.summary}")
