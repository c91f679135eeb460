"""One overwrite policy for every file a user names: an existing file is refused unless --force, a
missing folder is refused and never created, in the same words everywhere, before any work."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsv4opt.cli import app
from tests.decision.profiles import story_after_attention

runner = CliRunner()
KERNEL = {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0, "tid": 7, "ts": 1.0, "dur": 2.5}


@pytest.fixture
def inputs(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [KERNEL]}))
    profile = story_after_attention().save(tmp_path / "p.json")
    return {"trace": str(trace), "profile": str(profile)}


# command line (OUT stands for the file), the option that names it
FILE_COMMANDS = {
    "analyze": (["analyze", "{trace}", "--json", "OUT"], "--json"),
    "compare": (["compare", "{profile}", "{profile}", "--json", "OUT"], "--json"),
    "recommend": (["recommend", "{profile}", "--json", "OUT"], "--json"),
    "report": (["report", "{profile}", "--out", "OUT"], "--out"),
    "bench": (["bench", "mma-attn", "--json", "OUT"], "--json"),
    "profile": (["profile", "--device", "cpu", "--out", "OUT"], "--out"),
    "glue": (["glue", "{profile}", "--json", "OUT"], "--json"),
}


def _args(template, inputs, out):
    return [out if a == "OUT" else a.format(**inputs) for a in template]


@pytest.mark.parametrize("name", list(FILE_COMMANDS))
def test_an_existing_file_is_refused_without_force(name, inputs, tmp_path):
    template, option = FILE_COMMANDS[name]
    out = tmp_path / ("out.html" if name == "report" else "out.json")
    out.write_text("mine")
    r = runner.invoke(app, _args(template, inputs, str(out)))
    assert r.exit_code == 1
    assert f"{out} already exists; pass --force to replace it, or choose another {option}" in r.output
    assert out.read_text() == "mine" and "Traceback" not in r.output


@pytest.mark.parametrize("name", list(FILE_COMMANDS))
def test_a_missing_folder_is_refused_and_not_created(name, inputs, tmp_path):
    template, option = FILE_COMMANDS[name]
    out = tmp_path / "typo" / ("out.html" if name == "report" else "out.json")
    r = runner.invoke(app, _args(template, inputs, str(out)))
    assert r.exit_code == 1
    assert f"folder {out.parent} does not exist; create it first or choose another {option}" in r.output
    assert not out.parent.exists()


@pytest.mark.parametrize("name", ["analyze", "compare", "recommend", "report"])
def test_force_replaces_the_file(name, inputs, tmp_path):
    template, _ = FILE_COMMANDS[name]
    out = tmp_path / ("out.html" if name == "report" else "out.json")
    out.write_text("mine")
    r = runner.invoke(app, _args(template, inputs, str(out)) + ["--force"])
    assert r.exit_code == 0, r.output
    assert out.read_text() != "mine"


@pytest.mark.parametrize("args, option", [
    (["sweep", "--device", "cpu", "--out-dir"], "--out-dir"),
    (["profile", "--device", "cpu", "--trace-dir"], "--trace-dir"),
    (["sglang-switches", "mma-attn", "--sglang-version", "0.5.23", "--out"], "--out"),
    (["apply", "mma-attn", "--target", "sglang", "--sglang-version", "0.5.23", "--out"], "--out"),
])
def test_a_folder_under_a_missing_folder_is_refused(args, option, tmp_path):
    folder = tmp_path / "typo" / "here"
    r = runner.invoke(app, args + [str(folder)])
    assert r.exit_code == 1, r.output
    assert f"folder {folder.parent} does not exist; create it first or choose another {option}" in r.output
    assert not folder.parent.exists()


@pytest.mark.parametrize("args, option", [
    (["sweep", "--device", "cpu", "--out-dir"], "--out-dir"),
    (["profile", "--device", "cpu", "--trace-dir"], "--trace-dir"),
    (["sglang-switches", "mma-attn", "--sglang-version", "0.5.23", "--out"], "--out"),
    (["apply", "mma-attn", "--target", "sglang", "--sglang-version", "0.5.23", "--out"], "--out"),
])
def test_a_missing_folder_is_refused_not_created(args, option, tmp_path):
    """README: a missing folder is refused, never created (`--trace-dir nosuchdir` once made it and ran)."""
    folder = tmp_path / "nosuchdir"
    r = runner.invoke(app, args + [str(folder)])
    assert r.exit_code == 1, r.output
    assert f"folder {folder} does not exist; create it first or choose another {option}" in r.output
    assert not folder.exists()


@pytest.mark.parametrize("command", [["sglang-switches", "mma-attn", "--sglang-version", "0.5.23"],
                                     ["apply", "mma-attn", "--target", "sglang", "--sglang-version", "0.5.23"]])
def test_switch_files_follow_the_same_policy(command, tmp_path):
    mine = tmp_path / "sglang-mma-attn.env"
    mine.write_text("MY_SETTING=1\n")
    r = runner.invoke(app, command + ["--out", str(tmp_path)])
    assert r.exit_code == 1 and f"{mine} already exists; pass --force to replace it, or choose another --out" in r.output
    assert mine.read_text() == "MY_SETTING=1\n"
    r = runner.invoke(app, command + ["--out", str(tmp_path), "--force"])
    assert r.exit_code == 0, r.output
    assert mine.read_text() != "MY_SETTING=1\n"
