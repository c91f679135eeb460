"""`dsv4opt bench NAME`: an optimisation's micro-benchmark (check first, then timing)."""

import importlib
from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4opt.cli import KvLayout, app, console
from dsv4opt.errors import DsvOptError, unknown_name


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


def bench_module(name: str) -> str:
    """The benchmark module of optimisation `name`, found from the registry's data alone (no kernel
    imported), or a DsvOptError that says what to run instead."""
    from dsv4opt.optimizations.registry import OPTIMIZATIONS

    benches = {n: o.bench_module for n, o in OPTIMIZATIONS.items() if o.bench_module}
    if name in benches:
        return benches[name]
    if name in OPTIMIZATIONS:
        raise DsvOptError(f"{name} has no benchmark (benchmarks: {', '.join(benches) or 'none'}); its correctness gate "
                          f"runs with `dsv4opt list --check`, its effect on a step with `dsv4opt apply {name}`")
    raise unknown_name("benchmark", name, benches)


@app.command()
def bench(
    name: Annotated[str, typer.Argument(help="Optimisation whose benchmark to run (one with a bench module; see `dsv4opt list`).")],
    batch: Annotated[Optional[str], typer.Option(help="Comma-separated batch sizes (default: the benchmark's).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the results as JSON here.")] = None,
    kv: Annotated[KvLayout, typer.Option(help="KV cache layout the benchmark reads: fp8 (SGLang's) or bf16 (mma-attn; the others read no KV cache).")] = KvLayout.fp8,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --json file.")] = False,
) -> None:
    """Run an optimisation's correctness check, then time it against its floor and the baseline.

    \b
    Example:
      dsv4opt bench mma-attn --batch 1,16,64 --json mma-attn-bench.json
    """
    from dsv4opt.fileio import check_new_file

    module_name = bench_module(name)
    check_new_file(json_out, force, "--json")
    batches = _batches(batch)
    from dsv4opt.optimizations.timing import BenchOptions

    module = importlib.import_module(module_name)
    with console.status(f"bench {name}") as status:
        result = module.run_bench(BenchOptions(batches=batches, kv=kv.value,
                                               on_step=lambda msg: status.update(f"bench {name}: {msg}")))
    console.print(module.render(result))
    if json_out is not None:
        from dsv4opt.fileio import write_json_atomic

        write_json_atomic(json_out, result.as_json(), make_dirs=False)
        console.print(f"wrote {json_out}")
    if not result.check.passed:
        raise DsvOptError(f"{name} failed its correctness check: {result.check.summary}")
