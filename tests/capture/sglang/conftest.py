"""Fixtures for the SGLang target: a real trace to serve, a running stand-in, small settings."""

from __future__ import annotations

import gzip
import json
import socket
from pathlib import Path

import pytest

from dsv4opt.capture.settings import SGLangSettings
from tests.capture.sglang.standin import StandInSGLang
from tests.helpers import SHARED_TRACES

# A real SGLang decode trace (TraceLens, MI300X, batch 32) when ../shared is present.
REAL_DECODE_TRACE = SHARED_TRACES / "tracelens_sglang_qwen3_8b_decode_mi300x.json.gz"


def small_trace() -> dict:
    """A tiny Kineto-shaped trace: three kernels under one decode step annotation."""
    def kernel(name, ts, dur, corr):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"correlation": corr, "device": 0, "stream": 7}}
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "Stand-in GPU"}],
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "step[DECODE bs=4]", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
            kernel("_fwd_kernel_sparse_mla_decode", 5.0, 50.0, 1),
            kernel("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas", 56.0, 20.0, 2),
            kernel("at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 77.0, 2.5, 3),
        ],
    }


@pytest.fixture(scope="session")
def served_trace() -> dict:
    if REAL_DECODE_TRACE.is_file():
        with gzip.open(REAL_DECODE_TRACE, "rt") as f:
            return json.load(f)
    return small_trace()


@pytest.fixture
def standin(served_trace):
    with StandInSGLang(served_trace) as server:
        yield server


@pytest.fixture
def free_port_url() -> str:
    """An address on loopback where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def small_settings(url: str, tmp_path: Path, **overrides) -> SGLangSettings:
    """Settings that keep every phase short: a fault ends the test within a few seconds."""
    base = dict(
        url=url, concurrency=4, prompt_len=8, max_new_tokens=100_000, profile_steps=3,
        trace_dir=tmp_path / "traces", connect_timeout_s=1.0, ready_timeout_s=5.0, trace_timeout_s=2.0,
        stall_timeout_s=1.0, window_s=0.3, request_timeout_s=2.0, settle_s=0.3, out=tmp_path / "out" / "p.json",
    )
    base.update(overrides)
    (tmp_path / "out").mkdir(exist_ok=True)  # a user's --out folder exists: dsv4opt never creates it
    return SGLangSettings(**base)
