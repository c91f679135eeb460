"""Trace file names as SGLang writes them, completeness of gzip files, waiting with timeouts."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import threading
import time
from pathlib import Path

import pytest

from dsv4opt.capture.sglang.traces import decode_traces, gzip_complete, parse_trace_name, wait_for_traces
from dsv4opt.errors import CaptureError

NAMES = [
    # (file name, profile_id, tp, dp, pp, ep, stage) - forms seen in SGLang's code and in users' runs
    ("1776651754-TP-0-DECODE.trace.json.gz", "1776651754", 0, None, None, None, "decode"),
    ("1782703516.8744757-TP-3-EXTEND.trace.json.gz", "1782703516.8744757", 3, None, None, None, "prefill"),
    ("1782703516.8744757-TP-1.trace.json.gz", "1782703516.8744757", 1, None, None, None, None),
    ("my_exp-001-1782.5-TP-0-DP-1-PP-0-EP-2.trace.json.gz", "1782.5", 0, 1, 0, 2, None),
    ("in8192_out16_conc4_p8-AMD-TP-0-DECODE.trace.json.gz", "AMD", 0, None, None, None, "decode"),
    ("1700.1-TP-2-decode.trace.json.gz", "1700.1", 2, None, None, None, "decode"),
    ("1700.1-TP-2-prefill.trace.json.gz", "1700.1", 2, None, None, None, "prefill"),
]


@pytest.mark.parametrize("name,pid,tp,dp,pp,ep,stage", NAMES, ids=[n[0] for n in NAMES])
def test_parse_rank_trace_names(name, pid, tp, dp, pp, ep, stage):
    f = parse_trace_name(Path(name))
    assert (f.profile_id, f.tp, f.dp, f.pp, f.ep, f.stage) == (pid, tp, dp, pp, ep, stage)


@pytest.mark.parametrize("name", [
    "merged-1700.1.trace.json.gz", "1700.1-TP-0-memory.pickle", "notes.txt",
    "cuda_graph_capture-CudaGraphRunner-TP-0.json.gz", "1700.1-TP-0-memory.trace.json.gz",
])
def test_other_files_are_not_rank_traces(name):
    assert parse_trace_name(Path(name)) is None


def test_decode_selection():
    staged = [parse_trace_name(Path(n)) for n in ("9-TP-0-EXTEND.trace.json.gz", "9-TP-0-DECODE.trace.json.gz", "9-TP-1-DECODE.trace.json.gz")]
    assert [f.path.name for f in decode_traces(staged)] == ["9-TP-0-DECODE.trace.json.gz", "9-TP-1-DECODE.trace.json.gz"]
    plain = [parse_trace_name(Path(n)) for n in ("9-TP-1.trace.json.gz", "9-TP-0.trace.json.gz")]
    assert [f.path.name for f in decode_traces(plain)] == ["9-TP-0.trace.json.gz", "9-TP-1.trace.json.gz"]


def _gz(events=3) -> bytes:
    return gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "name": f"k{i}", "ts": i, "dur": 1} for i in range(events)]}).encode())


def test_gzip_complete(tmp_path):
    data = _gz(2000)
    whole, half, junk = tmp_path / "a.gz", tmp_path / "b.gz", tmp_path / "c.gz"
    whole.write_bytes(data)
    half.write_bytes(data[: len(data) // 2])
    junk.write_bytes(b"not gzip at all")
    assert gzip_complete(whole) and not gzip_complete(half) and not gzip_complete(junk)


def _wait(run_dir, **kw):
    kw.setdefault("timeout_s", 1.0)
    kw.setdefault("settle_s", 0.1)
    kw.setdefault("poll_s", 0.05)
    return asyncio.run(wait_for_traces(run_dir, **kw))


def test_complete_files_are_returned(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"5.5-TP-{rank}.trace.json.gz").write_bytes(_gz())
    (tmp_path / "merged-5.5.trace.json.gz").write_bytes(_gz())
    files = _wait(tmp_path, expected=2)
    assert sorted(f.tp for f in files) == [0, 1]


def test_file_written_in_pieces_is_waited_for(tmp_path):
    data, path = _gz(5000), tmp_path / "5.5-TP-0.trace.json.gz"

    def writer():
        with path.open("wb") as f:
            for i in range(0, len(data), len(data) // 4 + 1):
                f.write(data[i : i + len(data) // 4 + 1])
                f.flush()
                time.sleep(0.1)

    t = threading.Thread(target=writer)
    t.start()
    try:
        files = _wait(tmp_path, timeout_s=3.0)
    finally:
        t.join()
    assert gzip_complete(files[0].path) and files[0].path.read_bytes() == data


def test_empty_directory_times_out(tmp_path):
    with pytest.raises(CaptureError, match="stayed empty"):
        _wait(tmp_path, timeout_s=0.3)


def test_missing_directory_says_how_to_point_at_the_files(tmp_path):
    with pytest.raises(CaptureError, match="does not exist on this machine.*dsv4opt analyze"):
        _wait(tmp_path / "elsewhere", timeout_s=0.3)


def test_truncated_file_never_finishes(tmp_path):
    data = _gz(2000)
    (tmp_path / "5.5-TP-0.trace.json.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CaptureError, match="5.5-TP-0.trace.json.gz never finished writing"):
        _wait(tmp_path, timeout_s=0.4)


def test_check_failure_stops_the_wait(tmp_path):
    def check():
        raise CaptureError("load failed")

    with pytest.raises(CaptureError, match="load failed"):
        _wait(tmp_path, check=check)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_directory(tmp_path):
    d = tmp_path / "locked"
    d.mkdir()
    d.chmod(0)
    try:
        with pytest.raises(CaptureError, match="not readable here"):
            _wait(d)
    finally:
        d.chmod(0o755)
