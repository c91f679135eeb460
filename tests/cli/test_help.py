"""Every command's --help has an example; --version; options with fixed values list them."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

import dsv4opt
from dsv4opt.cli import app

runner = CliRunner()
COMMANDS = sorted(typer.main.get_command(app).commands)


def _help(*args: str) -> str:
    r = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_shows_an_example_of_itself(command):
    text = _help(command)
    assert re.search(r"Examples?:\n", text), text
    # the example lines are kept whole (not rewrapped) and run this very command
    assert re.search(rf"^\s+dsv4opt {re.escape(command)}\b.*$", text, re.M), text


def test_the_group_help_has_an_example_and_the_version_prints():
    assert "dsv4opt profile -c 32" in _help()
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"dsv4opt {dsv4opt.__version__}"


@pytest.mark.parametrize("command, shown", [
    ("profile", ("<embedded|sglang>", "<fp8|bf16>", "[cuda|cpu|cuda:N]")),
    ("apply", ("<embedded|sglang>",)),
    ("bench", ("<fp8|bf16>",)),
    ("sweep", ("[cuda|cpu|cuda:N]",)),
    ("report", ("<html|md>",)),
])
def test_choices_are_shown_as_choices(command, shown):
    text = _help(command)
    for choice in shown:
        assert choice in text


def test_a_value_outside_the_choices_is_refused_before_any_work(tmp_path):
    r = runner.invoke(app, ["profile", "--kv", "fp4", "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 2 and "'fp4' is not one of 'fp8', 'bf16'" in r.output
    assert not (tmp_path / "p.json").exists()
