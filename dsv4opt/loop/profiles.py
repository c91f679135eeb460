"""A profile from a capture: capture -> analyse -> save, for the embedded workload and SGLang."""

from __future__ import annotations

import tempfile
from pathlib import Path

import msgspec

from dsv4opt.analysis import analyze_paths
from dsv4opt.analysis.profile import Profile
from dsv4opt.capture.result import Captured, Progress, no_progress
from dsv4opt.capture.settings import EmbeddedSettings, SGLangSettings
from dsv4opt.errors import CaptureError


def analysed(captured: Captured) -> Profile:
    """The profile of a capture's traces, with its settings and measured throughput."""
    # the capture wrote these files itself, in one run: nothing to check about where they came from
    prof = analyze_paths(captured.traces, meta=captured.meta, capture=captured.capture_trace, one_capture=True)
    prof.meta = {**prof.meta, **captured.meta}
    prof.throughput = captured.throughput
    return msgspec.structs.replace(prof, **captured.extra)


def save_new(prof: Profile, out: Path, force: bool = False) -> Path:
    """Write the profile where the capture said; a file that appeared meanwhile is never overwritten
    (unless --force asked for `out` to be replaced)."""
    if out.exists() and not force:
        raise CaptureError(f"{out} appeared during the capture; not overwriting it")
    return prof.save(out)


def profile_embedded(settings: EmbeddedSettings, progress: Progress = no_progress) -> tuple[Profile, Path]:
    """Capture the embedded workload, analyse and save; returns the profile and where it was written."""
    from dsv4opt.capture.embedded import capture_embedded

    with tempfile.TemporaryDirectory(prefix="dsv4opt-embedded-") as tmp:
        keep = settings.trace_dir is not None
        captured = capture_embedded(settings, Path(settings.trace_dir) if keep else Path(tmp), progress)
        progress.stage("analysing the trace", None)
        prof = analysed(captured)
        if not keep:  # the traces go with the temporary folder: name none
            prof.meta["sources"], prof.meta["capture_trace"] = [], None
        return prof, save_new(prof, captured.out, settings.force)


def profile_sglang(settings: SGLangSettings) -> tuple[Profile, Path]:
    """Capture a live SGLang server's decode, analyse and save."""
    from dsv4opt.capture.sglang import capture_sglang

    captured = capture_sglang(settings)
    return (prof := analysed(captured)), save_new(prof, captured.out, settings.force)
