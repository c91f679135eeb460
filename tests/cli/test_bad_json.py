"""Bad JSON a user hands dsv4opt (state, profiles, sweep summaries): one line naming the file, the
field and what was expected; exit 1; never a traceback."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsv4opt.cli import app
from dsv4opt.state import state_path
from tests.helpers import FIXTURE_PROFILES

runner = CliRunner()
PROFILE = FIXTURE_PROFILES / "embedded-dsv4-flash-c32-ctx8192-baseline.json"
SWEEP = FIXTURE_PROFILES / "sweep-20261129-211727.json"


def _one_line_error(result, *expected: str) -> None:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not an uncaught error
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    for text in expected:
        assert text in lines[0], (text, lines[0])


STATES = {
    "last_profile_a_number": ({"last_profile": 5}, "status", ("last_profile", "expected str")),
    "check_verdict_a_string": ({"checks": {"bf16-gemm": "yes"}}, "list", ("checks.bf16-gemm", "expected object")),
    "check_passed_a_string": ({"checks": {"bf16-gemm": {"passed": "yes", "device": "cpu"}}}, "list",
                              ("checks.bf16-gemm.passed", "expected bool")),
    "enabled_not_names": ({"enabled": ["mma-attn", 3]}, "status", ("enabled[1]", "expected str")),
    "history_not_a_list": ({"history": {"action": "apply"}}, "status", ("history", "expected array")),
}


@pytest.mark.parametrize("case", list(STATES), ids=list(STATES))
def test_bad_state_is_one_line_naming_the_field(case):
    fields, command, expected = STATES[case]
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": "dsv4opt.state/1", **fields}))
    _one_line_error(runner.invoke(app, [command]), str(path), *expected, "status --reset")


def _edited_profile(edit) -> dict:
    data = json.loads(PROFILE.read_text())
    edit(data)
    return data


PROFILES = {
    "concurrency_a_string": (lambda d: d["meta"].update(concurrency="32"), ("meta.concurrency", "expected int")),
    "share_a_string": (lambda d: d["categories"][0].update(share="0.5"), ("categories[0].share", "expected float")),
    "kernel_count_missing": (lambda d: d["kernels"][3].pop("count"), ("kernels[3].count", "missing")),
    "unknown_category": (lambda d: d["categories"][1].update(category="bogus"),
                         ("categories[1]", "expected one of attention", "'bogus'")),
    "steps_count_a_string": (lambda d: d["steps"].update(count="10"), ("steps.count", "expected int")),
    "throughput_a_list": (lambda d: d.update(throughput=[1, 2]), ("throughput", "expected object")),
    "newer_schema": (lambda d: d.update(schema="dsv4opt.profile/2"),
                     ("schema", "expected 'dsv4opt.profile/1'", "'dsv4opt.profile/2'")),
    "kernels_an_object": (lambda d: d.update(kernels={}), ("kernels", "expected array")),
}


@pytest.mark.parametrize("command", ["compare", "recommend", "report"])
@pytest.mark.parametrize("case", list(PROFILES), ids=list(PROFILES))
def test_bad_profile_is_one_line_naming_the_field(tmp_path, case, command):
    edit, expected = PROFILES[case]
    bad = tmp_path / f"{case}.json"
    bad.write_text(json.dumps(_edited_profile(edit)))
    args = {"compare": ["compare", str(bad), str(PROFILE)], "recommend": ["recommend", str(bad)],
            "report": ["report", str(PROFILE), str(bad), "--out", str(tmp_path / "r.html")]}[command]
    _one_line_error(runner.invoke(app, args), str(bad), *expected)
    assert not (tmp_path / "r.html").exists()


def test_a_sweep_summary_given_as_a_profile_names_the_profiles_it_lists(tmp_path):
    listed = [row["profile"] for row in json.loads(SWEEP.read_text())["rows"]]
    result = runner.invoke(app, ["compare", str(SWEEP), str(PROFILE)])
    _one_line_error(result, str(SWEEP), "is a sweep summary, not a profile", listed[0], f"{len(listed)} in all")


def test_a_malformed_sweep_summary_names_its_field(tmp_path):
    data = json.loads(SWEEP.read_text())
    data["rows"][2]["concurrency"] = "16"
    bad = tmp_path / "sweep.json"
    bad.write_text(json.dumps(data))
    _one_line_error(runner.invoke(app, ["recommend", str(bad)]), str(bad), "rows[2].concurrency", "expected int")
