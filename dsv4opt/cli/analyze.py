"""`dsv4opt analyze` and `dsv4opt compare`: thin commands over dsv4opt.analysis."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4opt.cli import app, console


@app.command()
def analyze(
    traces: Annotated[list[Path], typer.Argument(help="Trace files (.json/.json.gz) or folders of per-rank traces.")],
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the profile (dsv4opt.profile/1) here.")] = None,
    top: Annotated[int, typer.Option(min=1, help="Kernels to show.")] = 15,
    capture: Annotated[Optional[Path], typer.Option(help="Graph-capture trace: match replayed kernels to their captured launches.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --json file.")] = False,
) -> None:
    """Rank the GPU kernels of torch.profiler traces by share of GPU time.

    \b
    Examples:
      dsv4opt analyze trace.json.gz --top 20
      dsv4opt analyze traces/ --json profile.json   # per-rank files of one run
      dsv4opt analyze graph.json.gz --capture eager.json.gz
    """
    from dsv4opt.cli import heavy_imports

    with heavy_imports(uses_blas=False):
        from dsv4opt.analysis import analyze_paths
        from dsv4opt.fileio import check_new_file
        from dsv4opt.report.tables import print_profile
    check_new_file(json_out, force, "--json")
    profile = analyze_paths(traces, capture=capture)
    print_profile(profile, top=top, console=console)
    if profile.meta.get("merged"):
        console.print(profile.meta["merged"], highlight=False)
    if json_out is not None:
        profile.save(json_out, make_dirs=False)
        console.print(f"profile written to {json_out}")


@app.command()
def compare(
    before: Annotated[Path, typer.Argument(help="Profile JSON or trace (before).")],
    after: Annotated[Path, typer.Argument(help="Profile JSON or trace (after).")],
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the comparison here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --json file, and compare profiles run under different settings (with a warning).")] = False,
) -> None:
    """Did the bottleneck move? Category shares, kernels that moved most, verdict.

    \b
    Example:
      dsv4opt compare profiles/before.json profiles/after.json --json diff.json
    """
    from dsv4opt.analysis import compare_profiles, load_profile_or_trace
    from dsv4opt.analysis.compare import require_comparable, setting_differences
    from dsv4opt.fileio import check_new_file, write_json_atomic
    from dsv4opt.report.tables import print_comparison

    check_new_file(json_out, force, "--json")
    a, b = load_profile_or_trace(before), load_profile_or_trace(after)
    for diff in require_comparable(a, b, force):
        console.print(f"[bold red]WARNING: settings differ, {diff}: this comparison mixes runs[/]", highlight=False)
    comparison = compare_profiles(a, b)
    comparison.notes.extend(f"settings differ: {d}" for d in setting_differences(a, b))
    print_comparison(comparison, console=console)
    if json_out is not None:
        from dsv4opt.analysis.profile import finite

        write_json_atomic(json_out, finite(comparison.to_dict()), make_dirs=False)
        console.print(f"comparison written to {json_out}")
