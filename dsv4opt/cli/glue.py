"""`dsv4opt glue`: the glue regions of a profile or trace, ranked by what fusing them would save."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4opt.cli import app, console
from dsv4opt.errors import DsvOptError


@app.command()
def glue(
    source: Annotated[Path, typer.Argument(help="A profile (JSON), or a trace file / folder of per-rank traces.")],
    capture: Annotated[Optional[Path], typer.Option(help="With a trace: the eager or capture trace that maps CUDA-graph replays to operators, parts and source lines.")] = None,
    top: Annotated[int, typer.Option(min=1, help="Regions to show.")] = 15,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the regions and what fuse-glue fuses as JSON here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --json file.")] = False,
) -> None:
    """Group the glue launches into regions between heavy kernels; rank them by the time fusing saves.

    \b
    Examples:
      dsv4opt glue profiles/before.json --top 20
      dsv4opt glue traces/run.trace.json --capture traces/run-eager.trace.json
    """
    from dsv4opt.analysis import analyze_paths
    from dsv4opt.analysis.profile import Profile, is_profile_file
    from dsv4opt.decision.glue_plan import glue_kernels, glue_of, glue_plan, require_glue
    from dsv4opt.fileio import check_new_file
    from dsv4opt.report.glue import print_glue, print_glue_kernels

    check_new_file(json_out, force, "--json")
    if is_profile_file(source):
        if capture is not None:
            raise DsvOptError("--capture goes with trace files; a profile was analyzed with its capture already")
        profile = Profile.load(source)
    else:
        profile = analyze_paths([source], capture=capture)
    if profile.time_basis == "gpu" and glue_of(profile) is None:
        # written before profiles kept regions: what its kernel table says, and how to get the rest
        kernels = glue_kernels(profile, str(source), _profile_again(profile))
        print_glue_kernels(kernels, console, top=top)
        out = {"glue": None, "plan": None, "kernels": kernels.to_dict()}
    else:
        summary = require_glue(profile, str(source))
        plan = glue_plan(profile)
        print_glue(summary, console, top=top, plan=plan)
        import msgspec

        out = {"glue": msgspec.to_builtins(summary), "plan": plan.to_dict()}
    if json_out is not None:
        from dsv4opt.fileio import finite
        from dsv4opt.fileio import write_json_atomic

        write_json_atomic(json_out, finite({"schema": "dsv4opt.glue/1", "source": str(source), **out}), make_dirs=False)
        console.print(f"glue written to {json_out}")


def _profile_again(profile) -> str | None:
    """The `dsv4opt profile` command that captures an embedded profile's settings again, each
    setting that differs from the option's default spelled out; None for another target."""
    import dataclasses

    from dsv4opt.capture.settings import EmbeddedSettings

    if profile.meta.get("target") != "embedded":
        return None
    settings, default = EmbeddedSettings.from_meta(profile.meta), EmbeddedSettings()
    words = [f"dsv4opt profile -c {settings.concurrency} --context {settings.context}"]
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if f.name in ("device", "concurrency", "context") or value == getattr(default, f.name):
            continue  # the device is whichever GPU runs it
        option = "--" + f.name.replace("_", "-")
        words.append(option if value is True else f"--no-{option[2:]}" if value is False else f"{option} {value}")
    if profile.meta.get("optimizations"):
        words.append("--with " + ",".join(profile.meta["optimizations"]))
    return " ".join(words)
