"""The closed loop: list, apply, revert, status, recommend, sweep, report."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4opt.cli import DEVICE_METAVAR, KvLayout, ReportFormat, Target, app, console
from dsv4opt.errors import DsvOptError


def _split_ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DsvOptError(f"--concurrency takes whole numbers separated by commas, not {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise DsvOptError(f"--concurrency needs one or more positive numbers, not {text!r}")
    return values


@app.command("list")
def list_(
    check: Annotated[bool, typer.Option("--check", help="Run every check on this device now (can take a while).")] = False,
) -> None:
    """The optimisations dsv4opt knows, what they replace and risk, and whether they are on.

    \b
    Examples:
      dsv4opt list
      dsv4opt list --check   # run every gate on this device
    """
    from dsv4opt.loop.apply import check_all
    from dsv4opt.optimizations.registry import OPTIMIZATIONS, env_enabled
    from dsv4opt.report.decision import print_check, print_optimisations
    from dsv4opt.report.progress import rich_progress
    from dsv4opt.state import load_state

    if check:
        with rich_progress() as progress:
            results = check_all(progress)
        for result in results.values():
            print_check(result, console)
    state = load_state()
    print_optimisations(list(OPTIMIZATIONS.values()), state.checks, state.enabled, set(env_enabled()), console)


@app.command()
def apply(
    name: Annotated[str, typer.Argument(help="Optimisation to switch on (see `dsv4opt list`).")],
    concurrency: Annotated[Optional[int], typer.Option(min=1, help="Re-profile at this concurrency (default: the last profile's).")] = None,
    reprofile: Annotated[bool, typer.Option("--reprofile/--no-reprofile", help="Re-profile and compare after switching on.")] = True,
    target: Annotated[Target, typer.Option(help="embedded (this tool's workload) or sglang (emit the server's switches).")] = Target.embedded,
    out: Annotated[Path, typer.Option(help="sglang: an existing folder for the env file and launch flags.")] = Path("."),
    keep: Annotated[bool, typer.Option("--keep", help="Keep it on even if the re-profile is slower beyond the measured noise.")] = False,
    force: Annotated[bool, typer.Option("--force", help="sglang: replace files of those names that hold something else.")] = False,
    sglang_version: Annotated[Optional[str], typer.Option(help="sglang: the server's version (default: the one installed here).")] = None,
) -> None:
    """Check NAME on this device, switch it on, re-profile, and show whether the bottleneck moved.

    \b
    Examples:
      dsv4opt apply bf16-gemm
      dsv4opt apply mma-attn --concurrency 64
      dsv4opt apply mma-attn --target sglang --out deploy/
    """
    from dsv4opt.optimizations.registry import get

    get(name)  # a typo is refused here, before anything loads torch
    from dsv4opt.report.decision import print_check

    if target is Target.sglang:
        from dsv4opt.capture.sglang.switches import apply_to_sglang, describe

        paths = apply_to_sglang(name, out, force=force, sglang_version=sglang_version)
        console.print(describe(name, sglang_version), highlight=False)
        for p in paths:
            console.print(f"wrote {p}")
        return
    from dsv4opt.loop.apply import apply_optimisation

    result = apply_optimisation(
        name, concurrency=concurrency, reprofile=reprofile, keep=keep,
        on_check=lambda r: print_check(r, console),
        on_before=lambda p: console.print(f"baseline profile saved: {p}"),
    )
    if result.switched_back:
        _print_shift(result, name)
        console.print(f"[bold red]{result.switched_back}[/]", highlight=False)
        return
    console.print(f"[green]{name} is on[/] (enabled: {', '.join(result.enabled)})")
    if result.after is None:
        console.print("not re-profiled (--no-reprofile); the next `dsv4opt profile` includes it")
        return
    _print_shift(result, name)


def _print_shift(result, name: str) -> None:
    from dsv4opt.analysis import compare_profiles
    from dsv4opt.analysis.categories import GLUE_TARGET
    from dsv4opt.analysis.compare import target_shift
    from dsv4opt.decision.glue_plan import glue_of, glue_outcome
    from dsv4opt.optimizations.registry import get
    from dsv4opt.report.tables import headline, print_comparison

    print_comparison(compare_profiles(result.before, result.after), console=console)
    console.print(target_shift(result.before, result.after, get(name).target_category).line(), highlight=False)
    if headline(result.after):
        console.print(f"now: {headline(result.after)}", highlight=False)
    if get(name).target_category == GLUE_TARGET and glue_of(result.before) and glue_of(result.after):
        from dsv4opt.report.glue import outcome_line

        console.print(outcome_line(glue_outcome(result.before, result.after, name)), highlight=False)
    console.print(f"profiles: {result.before_path} -> {result.after_path}", soft_wrap=True, highlight=False)


@app.command()
def revert(name: Annotated[str, typer.Argument(help="Optimisation to switch off.")]) -> None:
    """Switch NAME off; later profiles run without it.

    \b
    Example:
      dsv4opt revert mma-attn
    """
    from dsv4opt.loop.apply import revert_optimisation

    enabled = revert_optimisation(name)
    console.print(f"{name} is off (still on: {', '.join(enabled) or 'none'})")


@app.command()
def status(
    reset: Annotated[bool, typer.Option("--reset", help="Set the state aside (kept as a .bak file) and start afresh.")] = False,
) -> None:
    """What is on, the last profile and its headline figures, and where the state file is.

    \b
    Examples:
      dsv4opt status
      dsv4opt status --reset   # set a corrupt state aside
    """
    from dsv4opt.analysis.profile import Profile
    from dsv4opt.display import value
    from dsv4opt.optimizations.registry import env_enabled
    from dsv4opt.report.tables import headline
    from dsv4opt.state import load_state, reset_state, state_path

    if reset:
        kept = reset_state()
        console.print(f"state reset; the old state was kept as {kept}" if kept else "state reset (there was none)")
        return
    state = load_state()
    path = state_path()
    # soft_wrap: a path is never broken into lines by rich (the terminal wraps it, copy keeps it whole)
    console.print(f"state: {path}" + ("" if path.exists() else " (not written yet)"), soft_wrap=True, highlight=False)
    console.print(f"on: {', '.join(state.enabled) or 'nothing (baseline)'}")
    if env_enabled():
        console.print(f"on by env gate: {', '.join(env_enabled())}")
    if not state.last_profile:
        console.print("last profile: none yet (`dsv4opt profile`)")
        return
    console.print(f"last profile: {state.last_profile}", soft_wrap=True, highlight=False)
    if not Path(state.last_profile).exists():
        console.print("[yellow]that file is gone[/]; the next apply profiles afresh")
        return
    prof = Profile.load(state.last_profile)
    if headline(prof):
        console.print(f"  {headline(prof)}", highlight=False)
    if prof.throughput:
        console.print(f"  {value(prof.throughput.get('tokens_per_s'), '.1f')} tokens/s, "
                      f"{value(prof.throughput.get('ms_per_step'), '.2f')} ms/step", highlight=False)


@app.command()
def recommend(
    profile: Annotated[Optional[Path], typer.Argument(help="Profile or trace (default: the last profile).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the candidates and choice as JSON.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --json file.")] = False,
) -> None:
    """Rank what could speed this profile up and recommend one, with reasons.

    \b
    Examples:
      dsv4opt recommend
      dsv4opt recommend profiles/before.json --json rec.json
    """
    from dsv4opt.analysis import load_profile_or_trace
    from dsv4opt.decision.recommend import recommend as rank
    from dsv4opt.fileio import check_new_file, write_json_atomic
    from dsv4opt.display import shown_path
    from dsv4opt.report.decision import print_recommendation
    from dsv4opt.state import load_state

    check_new_file(json_out, force, "--json")
    state = load_state()
    if profile is None:
        if not state.last_profile:
            raise DsvOptError("no profile given and none recorded yet; run `dsv4opt profile` or name a profile")
        profile = Path(state.last_profile)
    prof = load_profile_or_trace(profile)
    rec = rank(prof, state.enabled)
    console.print(f"profile: {shown_path(profile)}", soft_wrap=True, highlight=False)
    print_recommendation(rec, console)
    if json_out:
        write_json_atomic(json_out, rec.to_dict(), make_dirs=False)


@app.command()
def sweep(
    concurrency: Annotated[str, typer.Option("--concurrency", "-c", help="Concurrencies, comma-separated.")] = "1,16,32,64",
    with_: Annotated[Optional[list[str]], typer.Option("--with", help="A variant: optimisations, comma-separated; repeat for more variants.")] = None,
    context: Annotated[int, typer.Option(min=1, help="Mean context length per request.")] = 8192,
    steps: Annotated[int, typer.Option(min=1, help="Decode steps to profile (and to time) per run.")] = 10,
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up steps outside the profiler.")] = 5,
    repeat: Annotated[int, typer.Option(min=1, help="Timed windows per run: tokens/s is their median, their spread the noise.")] = 3,
    config: Annotated[Optional[str], typer.Option(help="Model config (dsv4-flash, dsv4-tiny); default by device.")] = None,
    layers: Annotated[Optional[int], typer.Option(min=1, help="Run only the first L layers.")] = None,
    device: Annotated[Optional[str], typer.Option(metavar=DEVICE_METAVAR, help="cuda, cpu or one GPU (cuda:1); default cuda when present.")] = None,
    cuda_graph: Annotated[bool, typer.Option("--cuda-graph/--no-cuda-graph", help="Replay the decode step as a CUDA graph.")] = True,
    kv: Annotated[KvLayout, typer.Option(help="KV cache layout: fp8 (SGLang's) or bf16; as for profile.")] = KvLayout.fp8,
    sglang: Annotated[str, typer.Option("--sglang", help="The SGLang decode path reproduced: 0.5.14 (sm_120, default) or 0.5.23 (Hopper); as for profile.")] = "0.5.14",
    layout: Annotated[Optional[str], typer.Option(help="tp4, tp8 or dp-ep; default the recipe of the --sglang path, as for profile.")] = None,
    ranks: Annotated[int, typer.Option(min=1, help="The layout's ranks as processes on this host; as for profile.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed for weights and contexts.")] = 0,
    graph_context: Annotated[Optional[int], typer.Option(min=0, help="Tokens the decode metadata is sized to; default the model's context length; 0: as the contexts need.")] = None,
    out_dir: Annotated[Optional[Path], typer.Option(help="Where the profiles, the summary and the chart go: a folder that exists (the default, profiles/, is made if missing).")] = None,
) -> None:
    """Profile each concurrency, baseline and with --with, and tabulate tokens/s and shares.

    \b
    Examples:
      dsv4opt sweep -c 1,16,32,64 --with mma-attn --with mma-attn,bf16-gemm
      dsv4opt sweep -c 1,32 --sglang 0.5.23 --with mma-attn
    """
    from dsv4opt.capture.settings import EmbeddedSettings
    from dsv4opt.fileio import make_output_folder, unique_path, write_bytes_atomic
    from dsv4opt.optimizations.registry import get
    from dsv4opt.workload.paths import SGLangPath

    # names first, in light imports: a typo is refused before torch loads
    concurrencies = _split_ints(concurrency)
    variants = [[get(n.strip()).name for n in v.split(",") if n.strip()] for v in with_ or []]
    base = EmbeddedSettings(context=context, steps=steps, warmup=warmup, repeat=repeat, config=config, layers=layers,
                            device=device, cuda_graph=cuda_graph, kv=kv.value, seed=seed, ranks=ranks, sglang=sglang,
                            layout=layout or SGLangPath.from_name(sglang).layout, graph_context=graph_context)
    base.check_names()
    make_output_folder(out_dir, "--out-dir")
    from dsv4opt.loop.sweep import sweep as run_sweep
    from dsv4opt.report.decision import print_sweep
    from dsv4opt.report.plots import throughput_chart_png
    from dsv4opt.report.progress import rich_progress

    out_dir = out_dir or Path("profiles")
    with rich_progress() as progress:
        result = run_sweep(concurrencies, variants, base, out_dir=out_dir, progress=progress,
                           on_row=lambda r: console.print(f"C={r.concurrency} {r.variant}: {r.profile}",
                                                          soft_wrap=True, highlight=False))
    print_sweep(result.rows, console)
    console.print(f"summary: {result.summary_path}", soft_wrap=True, highlight=False)
    png = throughput_chart_png(result.rows)
    if png is not None:
        chart = write_bytes_atomic(unique_path(result.summary_path.with_suffix(".png")), png)
        console.print(f"chart: {chart}", soft_wrap=True, highlight=False)


@app.command()
def report(
    profiles: Annotated[list[Path], typer.Argument(help="Profiles (or traces) in order, e.g. before then after.")],
    out: Annotated[Optional[Path], typer.Option(help="Page to write (default report.html, or report.md with --format md).")] = None,
    fmt: Annotated[Optional[ReportFormat], typer.Option("--format", help="Default: from --out's extension, else html.")] = None,
    title: Annotated[str, typer.Option(help="Page title.")] = "dsv4opt report",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing page (and its charts, for md).")] = False,
) -> None:
    """One self-contained page: shares before/after, top kernels, verdict, throughput, evidence.

    \b
    Examples:
      dsv4opt report profiles/before.json profiles/after.json --out report.html
      dsv4opt report profiles/*.json --out sweep.md
    """
    from dsv4opt.analysis import load_profile_or_trace
    from dsv4opt.fileio import check_new_file, write_bytes_atomic, write_text_atomic
    from dsv4opt.loop.report_facts import build_report
    from dsv4opt.report.page import render_html, render_markdown

    fmt, out = _report_target(fmt.value if fmt else None, out)
    check_new_file(out, force, "--out")
    loaded = [load_profile_or_trace(p) for p in profiles]
    rep = build_report([str(p) for p in profiles], loaded, title=title)
    if fmt == "html":
        write_text_atomic(out, render_html(rep), make_dirs=False)
    else:
        text, files = render_markdown(rep, chart_dir=out.parent, stem=out.stem)
        for path in files:  # the charts beside the page are the user's files too
            check_new_file(path, force, "--out")
        for path, data in files.items():
            write_bytes_atomic(path, data, make_dirs=False)
        write_text_atomic(out, text, make_dirs=False)
    console.print(f"report written: {out}")


def _report_target(fmt: str | None, out: Path | None) -> tuple[str, Path]:
    """Format and file agree: --format follows --out's extension and names the default file."""
    by_suffix = {".html": "html", ".htm": "html", ".md": "md"}
    if out is None:
        fmt = fmt or "html"
        return fmt, Path(f"report.{fmt}")
    implied = by_suffix.get(out.suffix.lower())
    if fmt is None:
        if implied is None:
            raise DsvOptError(f"{out}: say the format with --format html|md (or name the file .html or .md)")
        return implied, out
    if implied is not None and implied != fmt:
        raise DsvOptError(f"--format {fmt} but {out} ends in {out.suffix}: they must agree")
    return fmt, out
