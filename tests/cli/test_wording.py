"""Small wording the newcomer review found (../shared/docs/newcomer-review.md, old #15 and new #12):
no line ends in spaces, no message names a command that does not exist, a CPU profile's #1 is an
operator, and the recommend header keeps its path on its line."""

from __future__ import annotations

import ast
import re

from typer.testing import CliRunner

from dsv4opt.analysis.profile import Profile
from dsv4opt.cli import app
from dsv4opt.report.tables import headline
from tests.decision.profiles import make_profile
from tests.helpers import REPO

runner = CliRunner()
HOPPER_C32 = REPO / "evidence/h200/profiles/hopper-0.5.23/embedded-dsv4-flash-c32-baseline-20261204-033223.json"


def test_no_output_line_ends_in_spaces():
    """analyze once printed 95 of its 104 lines with trailing spaces (rich pads its tables)."""
    for args in (["analyze", str(HOPPER_C32)], ["recommend", str(HOPPER_C32)], ["list"]):
        r = runner.invoke(app, args, env={"COLUMNS": "80"})
        assert r.exit_code == 0, r.output
        assert [line for line in r.output.splitlines() if line != line.rstrip()] == [], args


def test_the_recommend_header_keeps_its_path_whole(monkeypatch):
    monkeypatch.chdir(REPO)  # shown relative to the working folder (display.shown_path), on one line
    r = runner.invoke(app, ["recommend", str(HOPPER_C32)], env={"COLUMNS": "80"})
    assert r.output.splitlines()[0] == f"profile: {HOPPER_C32.relative_to(REPO)}"


def test_a_cpu_profile_names_its_top_operator_as_such():
    prof = make_profile([("aten::copy_", "copy", 10, 100.0)], meta={"target": "embedded"})
    prof.time_basis = "cpu_self"
    assert headline(prof) == "#1 category copy 100.0%; #1 CPU operator aten::copy_ 100.0%"
    assert headline(Profile.load(HOPPER_C32)).count("#1 kernel ") == 1


def _messages() -> list[tuple[str, int, str]]:
    """Every string constant in dsv4opt/ that is not a docstring: what the tool can say."""
    out = []
    for path in sorted((REPO / "dsv4opt").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        out += [(str(path.relative_to(REPO)), n.lineno, n.value) for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]
    return out


def test_messages_name_the_command_as_it_is_spelled():
    """"analyse the replay with the eager trace as --capture": `dsv4opt analyse` is no command."""
    assert [m for m in _messages() if re.search(r"\banalyse\b", m[2])] == []
    assert [m for m in _messages() if "with with_stack" in m[2]] == []
