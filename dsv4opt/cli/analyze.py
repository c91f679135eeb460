"""`dsv4opt analyze` and `dsv4opt compare`: thin commands over dsv4opt.analysis."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4opt.cli import app, console, err_console
from dsv4opt.errors import DsvOptError


@app.command()
def analyze(
    traces: Annotated[list[Path], typer.Argument(help="Trace files (.json/.json.gz) or folders of per-rank traces, or one saved profile to view.")],
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the profile (dsv4opt.profile/1) here.")] = None,
    top: Annotated[int, typer.Option(min=1, help="Kernels to show.")] = 15,
    capture: Annotated[Optional[Path], typer.Option(help="Graph-capture trace: match replayed kernels to their captured launches.")] = None,
    wide: Annotated[bool, typer.Option("--wide", help="Kernel names whole, however wide the lines get (and the trace's own names under the table).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --json file.")] = False,
) -> None:
    """Rank the GPU kernels of torch.profiler traces by share of GPU time, or show a saved profile.

    \b
    Examples:
      dsv4opt analyze trace.json.gz --top 20
      dsv4opt analyze traces/ --json profile.json   # per-rank files of one run
      dsv4opt analyze graph.json.gz --capture eager.json.gz
      dsv4opt analyze profiles/before.json --wide   # a saved profile, names whole
    """
    from dsv4opt import cli
    from dsv4opt.cli import collector_off, heavy_imports
    from dsv4opt.fileio import check_new_file

    check_new_file(json_out, force, "--json")
    with collector_off():
        prefetch = cli.early_prefetch or _prefetch(traces, capture)
        cli.early_prefetch = None  # this command closes it now
        try:
            with heavy_imports(uses_blas=False):
                from dsv4opt.analysis import analyze_paths, load_profile_or_trace
                from dsv4opt.analysis.api import saved_profiles_in
                from dsv4opt.analysis.profile import is_profile_file
                from dsv4opt.report.tables import print_profile, print_saved_profiles
            folders = [(p, found) for p in traces if (found := saved_profiles_in(p)) is not None]
            if folders:
                if len(traces) > 1 or json_out is not None or capture is not None:
                    raise DsvOptError(f"{folders[0][0]} holds saved profiles: `dsv4opt analyze {folders[0][0]}` alone lists "
                                      "them; --json and --capture go with trace files")
                print_saved_profiles(folders[0][1], console)
                return
            saved = [p for p in traces if is_profile_file(p)]
            if saved:
                if len(traces) > 1:
                    raise DsvOptError(f"{saved[0]} is a saved profile: analyze shows one profile at a time, or reads trace "
                                      "files; `dsv4opt report` puts several profiles side by side")
                if capture is not None:
                    raise DsvOptError("--capture goes with trace files; a profile was analyzed with its capture already")
                profile = load_profile_or_trace(saved[0])
            else:
                profile = analyze_paths(traces, capture=capture, prefetch=prefetch)
        finally:
            if prefetch is not None:
                prefetch.close()
        print_profile(profile, top=top, console=console, wide=wide, name=str(saved[0]) if saved else None)
        if profile.meta.get("merged"):
            console.print(profile.meta["merged"], highlight=False)
        if json_out is not None:
            profile.save(json_out, make_dirs=False)
            console.print(f"profile written to {json_out}")


# analyze's options that take a value, and its flags: what prefetch_from_argv needs to tell its
# trace arguments apart (a test holds them to the command's parameters).
VALUED_OPTIONS = ("--json", "--top", "--capture")
FLAG_OPTIONS = ("--wide", "--force")


def prefetch_from_argv(argv: list[str]):
    """The helper of _prefetch started from the raw command line, before typer parses it (parsing
    imports pydantic: 0.1 s the helper can read in); None for anything but `analyze` with plainly
    written options. What it reads is checked when the analysis asks for each file, so a wrong
    guess only costs the helper's work."""
    if not argv or argv[0] != "analyze":
        return None
    traces: list[Path] = []
    capture = None
    args = iter(argv[1:])
    for arg in args:
        if arg in VALUED_OPTIONS:
            value = next(args, None)
            if value is None:
                return None
            if arg == "--capture":
                capture = Path(value)
        elif arg.startswith("-"):
            if arg not in FLAG_OPTIONS:
                return None  # --help, --json=OUT, --: typer's to read
        else:
            traces.append(Path(arg))
    return _prefetch(traces, capture) if traces else None


def _prefetch(traces: list[Path], capture: Optional[Path]):
    """In a one-command process, a helper reading the trace files while the command parses and imports
    (dsv4opt/trace/prefetch.py); None for saved profiles, paths that will be refused, or in a
    long-lived caller (tests, notebooks)."""
    from dsv4opt import cli

    if not cli._one_shot:
        return None
    from dsv4opt.analysis.modelled import modelled_ops
    from dsv4opt.analysis.profile import is_profile_file
    from dsv4opt.errors import TraceError
    from dsv4opt.trace import expand_trace_paths
    from dsv4opt.trace.prefetch import Prefetch

    try:
        files = expand_trace_paths(list(traces))
    except TraceError:
        return None  # the analysis says why, as without a helper
    in_order = ([capture] if capture is not None else []) + files  # analyze_paths reads the capture first
    if any(not f.is_file() or is_profile_file(f) for f in in_order):
        return None
    return Prefetch.start(in_order, modelled_ops())


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
        from rich.markup import escape

        err_console.print(f"[yellow]warning:[/] settings differ, {escape(diff)}: this comparison mixes runs",
                          highlight=False, soft_wrap=True)
    comparison = compare_profiles(a, b)
    comparison.notes.extend(f"settings differ: {d}" for d in setting_differences(a, b))
    print_comparison(comparison, console=console)
    if json_out is not None:
        from dsv4opt.fileio import finite

        write_json_atomic(json_out, finite(comparison.to_dict()), make_dirs=False)
        console.print(f"comparison written to {json_out}")
