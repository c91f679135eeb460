"""`dsv4opt profile`: capture steady-state decode and save a profile."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dsv4opt.cli import DEVICE_METAVAR, KvLayout, Target, app, console
from dsv4opt.errors import DsvOptError


def _split(values: Optional[list[str]]) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


@app.command()
def profile(
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1, help="Requests decoding at once (C).")] = 32,
    target: Annotated[Target, typer.Option(help="embedded (built-in DeepSeek-V4-Flash-shaped model) or sglang (a live server).")] = Target.embedded,
    context: Annotated[int, typer.Option(min=1, help="Embedded: mean context length per request.")] = 8192,
    steps: Annotated[int, typer.Option(min=1, help="Decode steps to profile (and to time).")] = 10,
    warmup: Annotated[int, typer.Option(min=0, help="Embedded: warm-up steps outside the profiler.")] = 5,
    repeat: Annotated[int, typer.Option(min=1, help="Embedded: timed windows of --steps steps; tokens/s is their median, their spread the noise compare and apply judge against.")] = 3,
    config: Annotated[Optional[str], typer.Option(help="Embedded: model config (dsv4-flash, dsv4-tiny); default by device.")] = None,
    layers: Annotated[Optional[int], typer.Option(min=1, help="Embedded: run only the first L layers.")] = None,
    experts_resident: Annotated[Optional[int], typer.Option(min=1, help="Embedded: expert weight sets kept on the device.")] = None,
    device: Annotated[Optional[str], typer.Option(metavar=DEVICE_METAVAR, help="Embedded: cuda, cpu or one GPU (cuda:1); default cuda when present.")] = None,
    cuda_graph: Annotated[bool, typer.Option("--cuda-graph/--no-cuda-graph", help="Embedded: replay the decode step as a CUDA graph.")] = True,
    kv: Annotated[KvLayout, typer.Option(help="Embedded: KV cache layout: fp8 (SGLang's, 584 B a token) or bf16 (1 KB a token).")] = KvLayout.fp8,
    with_: Annotated[Optional[list[str]], typer.Option("--with", help="Optimisations to switch on, comma-separated (adds to those applied).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Profile JSON to write (default: a new file under profiles/).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
    trace_dir: Annotated[Optional[Path], typer.Option(help="Keep the raw trace(s) here (sglang: where the server writes them).")] = None,
    seed: Annotated[int, typer.Option(help="Embedded: seed for weights and contexts.")] = 0,
    sglang: Annotated[str, typer.Option("--sglang", help="Embedded: the SGLang decode path reproduced: 0.5.14 (its sm_120 path of June 2026, the story's; default) or 0.5.23 (today's Hopper path: FlashMLA itself, FP8 indexer, fused mHC, grouped W4A16 MoE).")] = "0.5.14",
    layout: Annotated[Optional[str], typer.Option(help="Embedded: how the deployment is split: tp4 (SGLang's sm_120 recipe: tensor parallel over 4 GPUs), tp8, or dp-ep (DP attention + EP over 8, not an SGLang recipe for sm_120); default the recipe of the --sglang path. C is the deployment's requests under tp, one rank's under dp-ep.")] = None,
    kernels: Annotated[str, typer.Option("--kernels", help="Embedded, --sglang 0.5.23: auto (SGLang's own DeepGEMM, Marlin and TileLang mHC kernels where they run here, built by `dsv4opt build-kernels`; our stand-ins elsewhere, one line a reason; default), sglang (SGLang's everywhere or refuse), stand-in (ours throughout).")] = "auto",
    graph_context: Annotated[Optional[int], typer.Option(min=0, help="Embedded: tokens SGLang's CUDA-graph decode metadata is sized to (index rows, the indexer's page table); default the model's context length, as SGLang does unless --context-length is set; 0: as wide as the drawn contexts need.")] = None,
    ranks: Annotated[int, typer.Option(min=1, help="Embedded: run the layout's ranks as processes on this host (one GPU each over NCCL, or the CPU over gloo): tp4 with 4, tp8 with 8 (all-reduces), dp-ep with 2, 4 or 8 (each its own C requests, experts/N experts, all-gather and reduce-scatter). 1: one rank alone, communication not run.")] = 1,
    rendezvous_timeout: Annotated[float, typer.Option(min=0.1, help="Embedded, --ranks: seconds the ranks may take to meet before the run is given up.")] = 120.0,
    url: Annotated[str, typer.Option(help="SGLang: server address.")] = "http://127.0.0.1:30000",
    prompt_len: Annotated[int, typer.Option(min=1, help="SGLang: prompt length in tokens.")] = 256,
    max_new_tokens: Annotated[int, typer.Option(min=2, help="SGLang: tokens per request (large enough to outlast the window).")] = 4096,
    timeout: Annotated[float, typer.Option(min=0.1, help="SGLang: seconds to wait for readiness / traces before giving up.")] = 300.0,
    stall_timeout: Annotated[float, typer.Option(min=0.1, help="SGLang: seconds without any streamed token that count as a stalled server.")] = 60.0,
    window: Annotated[float, typer.Option(min=0.1, help="SGLang: steady-state seconds measured for tokens/s, TPOT and ITL.")] = 10.0,
    profile_by_stage: Annotated[bool, typer.Option("--profile-by-stage/--no-profile-by-stage", help="SGLang: let the server split traces into prefill/decode files.")] = False,
) -> None:
    """Capture steady-state decode with torch.profiler, rank the GPU kernels, save a profile.

    \b
    Examples:
      dsv4opt profile -c 32 --repeat 5
      dsv4opt profile -c 32 --sglang 0.5.23
      dsv4opt profile --device cpu --config dsv4-tiny -c 4 --steps 3
      dsv4opt profile --target sglang --url http://127.0.0.1:30000 -c 32
    """
    from dsv4opt.capture.settings import EmbeddedSettings, SGLangSettings
    from dsv4opt.fileio import check_new_file, make_output_folder
    from dsv4opt.loop.enabled import enabled_optimizations
    from dsv4opt.optimizations.registry import get as get_optimization

    if ranks != 1 and target is not Target.embedded:
        raise DsvOptError("--ranks is for the embedded target; an SGLang server's ranks are its own")
    # names first, in light imports: a typo is refused before torch loads (2-3 s)
    asked = [get_optimization(n).name for n in _split(with_)]
    if target is Target.embedded:
        from dsv4opt.workload.paths import SGLangPath

        settings = EmbeddedSettings(
            concurrency=concurrency, context=context, steps=steps, warmup=warmup, repeat=repeat, config=config,
            layers=layers, experts_resident=experts_resident, device=device, cuda_graph=cuda_graph, kv=kv.value,
            optimizations=enabled_optimizations(asked), out=out, force=force, trace_dir=trace_dir, seed=seed,
            ranks=ranks, rendezvous_timeout_s=rendezvous_timeout, layout=layout or SGLangPath.from_name(sglang).layout,
            graph_context=graph_context, sglang=sglang, sglang_kernels=kernels,
        )
        settings.check_names()
    check_new_file(out, force, "--out")
    from dsv4opt.decision.diagnose import diagnose
    from dsv4opt.loop.apply import record_profile
    from dsv4opt.report.decision import print_diagnosis
    from dsv4opt.report.tables import print_profile

    if target is Target.embedded:
        from dsv4opt.loop.profiles import profile_embedded
        from dsv4opt.report.progress import rich_progress

        make_output_folder(trace_dir, "--trace-dir")
        with rich_progress() as progress:
            prof, path = profile_embedded(settings, progress)
    else:
        from dsv4opt.loop.profiles import profile_sglang

        settings = SGLangSettings(
            url=url, concurrency=concurrency, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
            profile_steps=steps, trace_dir=trace_dir, ready_timeout_s=timeout, trace_timeout_s=timeout,
            stall_timeout_s=stall_timeout, window_s=window, profile_by_stage=profile_by_stage, out=out, force=force,
            # the server's switches are invisible from here: --with declares what it was launched with
            optimizations=asked, seed=seed,
        )
        prof, path = profile_sglang(settings)
        for warning in prof.meta.get("warnings", []):
            typer.secho(f"warning: {warning}", fg="yellow", err=True)
    print_profile(prof, console=console)
    print_diagnosis(diagnose(prof), console)
    record_profile(path)
    console.print(f"profile saved: {path}", soft_wrap=True, highlight=False)
