"""`profile --ranks N`: the embedded workload as N real ranks of its layout.

Each rank is a process on this host (one GPU each, NCCL; or the CPU, gloo) running the same warm-up,
profiled and timed steps as a single-rank capture (embedded.run_rank) and communicating for real
(dsv4opt/workload/collectives.py): tensor-parallel ranks (tp4 with 4 ranks, tp8 with 8) all decode
the same C requests and all-reduce; dp-ep ranks attend for their own C requests and gather and
combine the MoE's tokens. Each rank writes its own trace, named as SGLang names such a rank's trace,
so the analysis reads them as the ranks of one run. The deployment steps at the pace of its slowest
rank: a timed window's ms/step is the largest over the ranks.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

import torch

from dsv4opt.capture import embedded
from dsv4opt.capture.launcher import run_ranks
from dsv4opt.capture.result import Captured, Progress, no_progress
from dsv4opt.capture.settings import EmbeddedSettings
from dsv4opt.errors import CaptureError

RANKS = (1, 2, 4, 8)
# What every rank imports before it is forked, once (the fork server's preload).
PRELOAD = ("torch", "dsv4opt.workload.model", "dsv4opt.capture.embedded")


def trace_name(stem: str, rank: int, tensor_parallel: bool = False) -> str:
    """SGLang's per-rank trace name: TP only, or with DP attention and EP over all ranks
    (profiler_manager.py:302-318)."""
    if tensor_parallel:
        return f"{stem}-TP-{rank}.trace.json.gz"
    return f"{stem}-TP-{rank}-DP-{rank}-EP-{rank}.trace.json.gz"


def capture_ranks(settings: EmbeddedSettings, trace_dir: Path, progress: Progress = no_progress) -> Captured:
    """Run `settings.ranks` ranks, each profiling and timing its steps; their traces and the run's meta."""
    ranks = settings.ranks
    if ranks not in RANKS:
        raise CaptureError(f"--ranks {ranks}: use one of {', '.join(map(str, RANKS))}")
    if settings.experts_resident is not None:
        raise CaptureError(f"with --ranks {ranks} each rank holds experts / {ranks} of them; leave --experts-resident out")
    plan = embedded.plan_run(settings)  # refuses a layout or config that does not split over this many ranks
    tp = plan.deploy.tensor_parallel
    if plan.device.type == "cuda":
        if plan.device.index not in (None, 0):
            raise CaptureError(f"with --ranks each rank takes its own GPU (cuda:0..{ranks - 1}); use --device cuda")
        if torch.cuda.device_count() < ranks:
            raise CaptureError(f"--ranks {ranks} needs {ranks} GPUs; this machine has {torch.cuda.device_count()}")
    else:
        embedded.refuse_if_too_big(plan, settings, ranks=ranks, sharing=ranks)
    what = (f"all decode the same {settings.concurrency} requests, each with 1/{ranks} of the heads and experts' width, "
            "and all-reduce twice a layer" if tp else f"each attends for its own {settings.concurrency} requests and "
            "all-gathers and reduce-scatters the MoE's tokens")
    notes = plan.notes + [f"{ranks} ranks of {settings.layout} over {'NCCL' if plan.device.type == 'cuda' else 'gloo'}: {what}"]
    for note in notes:
        progress.note(note)
    out = embedded.output_path(settings, plan.config_name)
    stem = out.name[: -len(".json")]
    trace_dir = Path(trace_dir)
    workdir = Path(tempfile.mkdtemp(prefix="dsv4opt-ranks-"))
    progress.stage(f"starting {ranks} ranks", None)
    results = run_ranks(profile_rank, ranks, "nccl" if plan.device.type == "cuda" else "gloo", workdir,
                        args=(settings, str(trace_dir), stem), rendezvous_timeout_s=settings.rendezvous_timeout_s,
                        progress=progress, preload=PRELOAD)
    shutil.rmtree(workdir, ignore_errors=True)  # kept, with the ranks' logs, when a rank failed
    return Captured(traces=[Path(r["trace"]) for r in results],
                    capture_trace=Path(results[0]["capture_trace"]) if results[0]["capture_trace"] else None,
                    meta=_meta(results, ranks, tp), throughput=throughput_of(results, settings.concurrency, tp), out=out,
                    notes=notes)


def profile_rank(ctx, settings: EmbeddedSettings, trace_dir: str, stem: str) -> dict:
    """One rank's capture (runs in the rank's process): join, build, warm up, profile, time."""
    from dsv4opt.workload.collectives import ProcessGroupRanks

    cuda = ctx.backend == "nccl"
    device = torch.device("cuda", ctx.rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    ctx.join(device if cuda else None)
    plan = embedded.plan_run(settings, device)
    if cuda:
        embedded.refuse_if_too_big(plan, settings, ranks=ctx.ranks)
    name = trace_name(stem, ctx.rank, plan.deploy.tensor_parallel)
    run = embedded.run_rank(settings, plan, Path(trace_dir) / name, Path(trace_dir) / "eager" / name,
                            ctx.progress(), comm=ProcessGroupRanks())
    return {"trace": str(run.trace), "capture_trace": str(run.capture_trace) if run.capture_trace else None,
            "windows": run.windows, "meta": run.meta}


def throughput_of(results: list[dict], concurrency: int, tensor_parallel: bool = False) -> dict:
    """Tokens/s of the whole deployment and of one rank, from each window's slowest rank (tensor
    parallel: every rank decodes the same C requests, so the deployment's is one rank's)."""
    windows = [max(w) for w in zip(*(r["windows"] for r in results))]
    ms = statistics.median(windows)
    ranks = 1 if tensor_parallel else len(results)
    return {"tokens_per_s": ranks * concurrency * 1000.0 / ms, "tokens_per_s_per_rank": concurrency * 1000.0 / ms,
            "ms_per_step": ms, "ms_per_step_windows": windows,
            "ms_per_step_by_rank": [statistics.median(r["windows"]) for r in results]}


def _meta(results: list[dict], ranks: int, tensor_parallel: bool = False) -> dict:
    meta = dict(results[0]["meta"])
    meta.update({"ranks": ranks, "expert_parallel": None if tensor_parallel else ranks,
                 "backend": "nccl" if meta["device_kind"] == "cuda" else "gloo",
                 # tensor-parallel ranks hold the same requests: their contexts once
                 "contexts": meta["contexts"] if tensor_parallel else [c for r in results for c in r["meta"]["contexts"]]})
    return meta
