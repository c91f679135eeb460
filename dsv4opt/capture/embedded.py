"""Capture steady-state decode of the embedded DeepSeek-V4-Flash workload: traces and timings.

One process plays one rank (capture/rank_run.py); with `settings.ranks` > 1, capture/ranks.py runs
the layout's ranks as processes, each doing the same. Capture only captures: the loop
(dsv4opt/loop/profiles.py) analyses the traces and saves the profile.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from dsv4opt.capture.rank_run import output_path, plan_run, refuse_if_too_big, run_rank
from dsv4opt.capture.ranks import capture_ranks
from dsv4opt.capture.result import Captured, Progress, no_progress
from dsv4opt.capture.settings import EmbeddedSettings
from dsv4opt.fileio import unique_path


def capture_embedded(settings: EmbeddedSettings, trace_dir: Path, progress: Progress = no_progress) -> Captured:
    """Build the workload, warm up, profile S steps into `trace_dir`, time S steps."""
    if getattr(settings, "ranks", 1) != 1:
        return capture_ranks(settings, trace_dir, progress)
    plan = plan_run(settings)
    for note in plan.notes:
        progress.note(note)
    refuse_if_too_big(plan, settings)
    out = output_path(settings, plan.config_name)
    stem = out.name[: -len(".json")]
    run = run_rank(settings, plan, unique_path(trace_dir / f"{stem}.trace.json"),
                   unique_path(trace_dir / f"{stem}-eager.trace.json"), progress)
    ms_per_step = statistics.median(run.windows)
    throughput = {"tokens_per_s": settings.concurrency * 1000.0 / ms_per_step, "ms_per_step": ms_per_step,
                  "ms_per_step_windows": run.windows}
    return Captured(traces=[run.trace], capture_trace=run.capture_trace, meta=run.meta, throughput=throughput, out=out,
                    notes=plan.notes)
