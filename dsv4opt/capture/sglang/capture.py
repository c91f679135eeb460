"""Capture a live SGLang server's steady-state decode: its decode traces and load metrics.

Flow: ask the server what it is -> start exactly C streaming requests -> wait until all C are
decoding -> measure a window from the streamed chunks -> `/start_profile` for N steps into a fresh
directory -> keep the load running until every rank's trace is complete -> cancel the requests.
The loop (dsv4opt/loop/profiles.py) analyses the decode traces and writes the profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dsv4opt.capture.naming import profile_path
from dsv4opt.capture.result import Captured
from dsv4opt.capture.settings import SGLangSettings
from dsv4opt.capture.sglang.client import SGLangClient
from dsv4opt.capture.sglang.load import LoadGenerator
from dsv4opt.capture.sglang.metrics import window_metrics
from dsv4opt.capture.sglang.traces import TraceFile, decode_traces, wait_for_traces
from dsv4opt.errors import CaptureError, DsvOptError
from dsv4opt.fileio import check_new_file

# Server arguments worth keeping with the profile (present in SGLang's /server_info).
_SERVER_KEYS = (
    "model_path", "served_model_name", "tp_size", "dp_size", "pp_size", "ep_size", "enable_dp_attention",
    "attention_backend", "kv_cache_dtype", "disable_cuda_graph", "cuda_graph_max_bs", "moe_runner_backend",
    "quantization", "max_running_requests", "chunked_prefill_size",
)


@dataclass
class CaptureResult:
    server_info: dict[str, Any]
    model_info: dict[str, Any]
    metrics: dict[str, Any]
    steady: bool
    finished_in_window: int
    profile_request: dict[str, Any]
    run_dir: Path
    traces: list[TraceFile]


def capture_sglang(settings: SGLangSettings) -> Captured:
    """Load the server, profile its decode; the decode-stage traces with what was run and measured."""
    _validate(settings)
    out = Path(settings.out) if settings.out else profile_path("sglang", None, settings.concurrency, settings.optimizations)
    run_dir = _trace_root(settings) / f"dsv4opt-{_stamp()}-{os.getpid()}"
    result = asyncio.run(capture(settings, run_dir))
    decode = decode_traces(result.traces)
    if not decode:
        raise CaptureError(
            f"the server wrote traces to {run_dir} but none of the decode stage "
            f"({', '.join(t.path.name for t in result.traces)}); run `dsv4opt analyze {run_dir}` to see them"
        )
    throughput = {
        "tokens_per_s": float(result.metrics["output_tokens_per_s"]),
        "ms_per_step": float(result.metrics["tpot_ms_median"]),
    }
    return Captured(traces=[t.path for t in decode], meta=_meta(settings, result, decode), throughput=throughput,
                    out=out, extra={"load_metrics": result.metrics, "run_dir": str(run_dir)})


async def capture(settings: SGLangSettings, run_dir: Path) -> CaptureResult:
    """The network part: load, measure, profile, wait for complete traces. Writes nothing itself."""
    client = SGLangClient(
        settings.url,
        connect_timeout_s=settings.connect_timeout_s,
        request_timeout_s=settings.request_timeout_s,
        stall_timeout_s=settings.stall_timeout_s,
    )
    async with client:
        server_info = await client.server_info()
        model_info = await _optional(client.model_info())
        load = LoadGenerator(
            client,
            concurrency=settings.concurrency,
            prompt_len=settings.prompt_len,
            max_new_tokens=settings.max_new_tokens,
            stall_timeout_s=settings.stall_timeout_s,
            seed=settings.seed,
        )
        body = _profile_request(settings, run_dir)
        profiling = traces_done = False
        load.start()
        try:
            await load.wait_until(
                load.all_decoding, timeout_s=settings.ready_timeout_s,
                what=f"all {settings.concurrency} requests to finish prefill and decode",
            )
            t0 = time.monotonic()
            await load.run_for(settings.window_s)
            t1 = time.monotonic()
            silent = load.silent_since(t0)
            if silent:
                raise CaptureError(
                    f"{silent} of {settings.concurrency} requests got no token during the {settings.window_s:g} s "
                    "window: the server stalled (check its log) or steps are slower than the window (--window)"
                )
            metrics = window_metrics([r.events for r in load.records], t0, t1)
            steady = load.all_decoding() and load.finished_between(t0, t1) == 0
            await client.start_profile(body)
            profiling = True
            traces = await wait_for_traces(
                run_dir,
                timeout_s=settings.trace_timeout_s,
                settle_s=settings.settle_s,
                expected=_expected_rank_files(server_info, settings.profile_by_stage),
                # the trace export blocks the server's scheduler: a stream going quiet then is expected
                check=lambda: load.check(allow_stalls=True),
            )
            traces_done = True
            finished = load.finished_between(t0, time.monotonic())
        finally:
            await load.close()
            if profiling and not traces_done:
                # Leave no profiler running on the user's server; an error here changes nothing.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop_profile(), timeout=min(5.0, settings.request_timeout_s))
    return CaptureResult(server_info, model_info, metrics, steady and finished == 0, finished, body, run_dir, traces)


def _profile_request(settings: SGLangSettings, run_dir: Path) -> dict[str, Any]:
    """The /start_profile body (fields of SGLang's ProfileReqInput)."""
    return {
        "output_dir": str(run_dir),
        "num_steps": settings.profile_steps,
        "activities": ["CPU", "GPU"],
        "profile_by_stage": settings.profile_by_stage,
        "with_stack": settings.with_stack,
        "record_shapes": settings.record_shapes,
    }


def _expected_rank_files(info: dict[str, Any], by_stage: bool) -> int | None:
    """Trace files SGLang writes: one per TP rank of each pipeline stage (and per DP replica unless
    DP attention folds DP into TP); None when the server does not say."""
    try:
        tp, pp, dp = int(info["tp_size"]), int(info.get("pp_size") or 1), int(info.get("dp_size") or 1)
    except (KeyError, TypeError, ValueError):
        return None
    if info.get("enable_dp_attention"):
        dp = 1
    return None if by_stage else tp * pp * dp  # by stage, a prefill file may or may not come


def _meta(settings: SGLangSettings, result: CaptureResult, decode: list[TraceFile]) -> dict[str, Any]:
    info, model = result.server_info, result.model_info
    warnings = []
    if not result.steady:
        warnings.append(
            f"{result.finished_in_window} request(s) finished during the window or profile: raise "
            "--max-new-tokens so prefill does not mix into decode"
        )
    return {
        "target": "sglang",
        "url": settings.url,
        "concurrency": settings.concurrency,
        "model": model.get("model_path") or info.get("served_model_name") or info.get("model_path"),
        "sglang_version": info.get("version"),
        "server_args": {k: info[k] for k in _SERVER_KEYS if k in info},
        "optimizations": list(settings.optimizations),
        "optimizations_source": "declared with --with; dsv4opt cannot read the server's environment",
        "load": {
            "prompt_len": settings.prompt_len,
            "max_new_tokens": settings.max_new_tokens,
            "window_s": settings.window_s,
            "profile_steps": settings.profile_steps,
            "steady": result.steady,
        },
        "profile_request": result.profile_request,
        "trace_dir": str(result.run_dir),
        "rank_names": [t.rank for t in decode],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "warnings": warnings,
    }


async def _optional(coro) -> dict[str, Any]:
    """model_info is nice to have: a server without it still gets profiled."""
    try:
        return await coro
    except CaptureError:
        return {}


def _validate(s: SGLangSettings) -> None:
    if not s.url.startswith(("http://", "https://")):
        raise DsvOptError(f"--url {s.url!r} must look like http://HOST:PORT")
    for name in ("concurrency", "prompt_len", "profile_steps"):
        if getattr(s, name) < 1:
            raise DsvOptError(f"{name.replace('_', '-')} must be at least 1")
    if s.max_new_tokens < 2:
        raise DsvOptError("--max-new-tokens must be at least 2 (one token ends prefill, the rest decode)")
    for name in ("connect_timeout_s", "ready_timeout_s", "trace_timeout_s", "stall_timeout_s", "request_timeout_s", "window_s"):
        if not getattr(s, name) > 0:
            raise DsvOptError(f"{name} must be positive")
    check_new_file(s.out, s.force, "--out")
    if s.trace_dir is not None and Path(s.trace_dir).exists() and not os.access(s.trace_dir, os.R_OK | os.X_OK):
        raise DsvOptError(f"--trace-dir {s.trace_dir} is not readable here; pick a directory this user can read")


def _trace_root(s: SGLangSettings) -> Path:
    # Absolute: the server resolves a relative output_dir against its own working directory.
    root = Path(s.trace_dir) if s.trace_dir is not None else Path(tempfile.gettempdir()) / "dsv4opt-sglang"
    return root.expanduser().resolve()


def _stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")
