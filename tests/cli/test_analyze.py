import json

import pytest
from typer.testing import CliRunner

from dsv4opt.cli import app
from tests.helpers import SHARED_TRACES

runner = CliRunner()
KERNEL = {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.5}


def test_analyze_writes_profile(tmp_path):
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"traceEvents": [KERNEL]}))
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["analyze", str(t), "--json", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert data["schema"] == "dsv4opt.profile/1" and data["total_us"] == data["gpu_time_us"] == 2.5
    r = runner.invoke(app, ["analyze", str(t), "--json", str(out)])
    assert r.exit_code == 1 and "already exists" in r.output


BAD = {
    "missing": None,
    "empty": b"",
    "random": bytes(range(256)),
    "truncated": b'{"traceEvents": [{"ph": "X", "cat": "ker',
    "no_events": b'{"a": 1}',
    "null_events": b'{"traceEvents": null}',
    "corrupt_event": json.dumps({"traceEvents": [dict(KERNEL, dur=None)]}).encode(),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_one_line_exit_1_no_output(tmp_path, case):
    t = tmp_path / f"{case}.json"
    if BAD[case] is not None:
        t.write_bytes(BAD[case])
    out = tmp_path / "out.json"
    r = runner.invoke(app, ["analyze", str(t), "--json", str(out)])
    assert r.exit_code == 1
    assert "Traceback" not in r.output and r.output.strip().count("\n") == 0 and t.name in r.output
    assert not out.exists() and not list(tmp_path.glob(".out.json*"))


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces absent")
def test_analyze_real_trace_with_capture():
    r = runner.invoke(app, ["analyze", str(SHARED_TRACES / "tracelens_sglang_qwen3_8b_decode_mi300x.json.gz"),
                            "--capture", str(SHARED_TRACES / "tracelens_sglang_qwen3_8b_capture_bs32.json.gz"), "--top", "5"])
    assert r.exit_code == 0, r.output
    assert "categories" in r.output and "glue" in r.output
