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


PROFILES = __import__("tests.helpers", fromlist=["FIXTURE_PROFILES"]).FIXTURE_PROFILES
SAVED = PROFILES / "embedded-dsv4-flash-c32-ctx8192-mma-attn+bf16-gemm.json"


def _kernels(path):
    return json.loads(path.read_text())["kernels"]


def test_analyze_shows_a_saved_profile():
    """`analyze profile.json` once said "has no traceEvents": it shows the profile's tables."""
    r = runner.invoke(app, ["analyze", str(SAVED)], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    assert str(SAVED) in r.output and "top 15 kernels by GPU time" in r.output and "categories" in r.output
    first = _kernels(SAVED)[0]
    assert f"{100 * first['share']:.1f}%" in r.output and first["short_name"] in r.output


def test_analyze_takes_one_profile_and_no_capture(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [KERNEL]}))
    r = runner.invoke(app, ["analyze", str(SAVED), str(trace)])
    assert r.exit_code == 1 and "is a saved profile" in r.output and "dsv4opt report" in r.output
    r = runner.invoke(app, ["analyze", str(SAVED), "--capture", str(trace)])
    assert r.exit_code == 1 and "--capture goes with trace files" in r.output


def test_wide_shows_every_name_whole_at_80_columns():
    """At 80 columns (and piped into a file) analyze kept 14 characters of a name; --wide keeps them
    all, and lists the trace's own names where the table shows a shorter one."""
    narrow = runner.invoke(app, ["analyze", str(SAVED), "--top", "15"], env={"COLUMNS": "80"})
    assert narrow.exit_code == 0 and "`dsv4opt analyze PROFILE --wide` shows them whole" in narrow.output
    r = runner.invoke(app, ["analyze", str(SAVED), "--top", "15", "--wide"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    table = r.output[:r.output.index("who launched")]
    for i, k in enumerate(_kernels(SAVED)[:15], 1):
        row = next(line for line in table.splitlines() if line.split()[:1] == [str(i)]).rstrip()
        # its short name whole, or where two short names are alike the longer name that tells them apart
        cell = row[row.index(k["short_name"].split("<")[0]):]
        assert cell == k["short_name"] or "…" not in cell, (k["short_name"], row)
        if k["name"] != k["short_name"]:
            assert f"  #{i} {k['name']}\n" in r.output
    assert "--wide` shows" not in r.output


def test_analyze_a_folder_of_saved_profiles_lists_them(tmp_path):
    """`analyze profiles/hopper-0.5.23/` once said "…c1-baseline….json: has no traceEvents"."""
    import shutil
    from pathlib import Path

    hopper = Path(__file__).resolve().parents[2] / "evidence" / "h200" / "profiles" / "hopper-0.5.23"
    files = sorted(hopper.glob("*.json"))
    folder = tmp_path / "saved"
    folder.mkdir()
    for f in files[:3]:
        shutil.copy(f, folder / f.name)
    for width in ("200", "80"):
        r = runner.invoke(app, ["analyze", str(folder)], env={"COLUMNS": width})
        assert r.exit_code == 0, r.output
        assert f"{folder}: 3 saved profiles" in r.output and "has no traceEvents" not in r.output
        for f in files[:3]:
            data = json.loads(f.read_text())
            assert f.name in r.output  # whole, at either width
            assert f"{data['throughput']['tokens_per_s']:.2f}" in r.output
        assert r.output.count("0.5.23 Hopper (sm_90)") == 3
        assert r.output.rstrip().splitlines()[-1] == (f"`dsv4opt analyze {folder}/FILE` shows one; "
                                                      f"`dsv4opt report {folder}/*.json` puts them side by side")
    trace = folder / "rank0.json"
    trace.write_text(json.dumps({"traceEvents": [KERNEL]}))
    r = runner.invoke(app, ["analyze", str(folder)])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{folder} holds both saved profiles (3) and traces (1)" in r.output
    trace.unlink()
    r = runner.invoke(app, ["analyze", str(folder), "--json", str(tmp_path / "p.json")])
    assert r.exit_code == 1 and "--json and --capture go with trace files" in r.output
