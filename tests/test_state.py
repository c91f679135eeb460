"""The project state is found from any subfolder of the project, like git's .git."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsv4opt.cli import app
from dsv4opt.state import State, load_state, project_root, save_state, state_path


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder with a .dsv4opt/ and two levels of subfolders; DSV4OPT_STATE unset."""
    monkeypatch.delenv("DSV4OPT_STATE", raising=False)
    root = tmp_path / "proj"
    (root / ".dsv4opt").mkdir(parents=True)
    (root / "a" / "b").mkdir(parents=True)
    return root


def test_found_from_a_subfolder(project, monkeypatch):
    monkeypatch.chdir(project / "a" / "b")
    assert project_root() == project
    assert state_path() == project / ".dsv4opt" / "state.json"


def test_nearest_project_wins(project, monkeypatch):
    (project / "a" / ".dsv4opt").mkdir()
    monkeypatch.chdir(project / "a" / "b")
    assert state_path() == project / "a" / ".dsv4opt" / "state.json"


def test_without_a_project_it_is_created_in_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("DSV4OPT_STATE", raising=False)
    monkeypatch.chdir(tmp_path)
    save_state(State(enabled=["bf16-gemm"]))
    assert json.loads((tmp_path / ".dsv4opt" / "state.json").read_text())["enabled"] == ["bf16-gemm"]


def test_a_relative_last_profile_is_read_against_the_project_folder(project, monkeypatch):
    """State files written before paths were recorded absolute hold them relative to the project."""
    (project / ".dsv4opt" / "state.json").write_text(json.dumps(
        {"schema": "dsv4opt.state/1", "last_profile": "profiles/p.json",
         "history": [{"action": "profile", "profile": "profiles/p.json"}]}))
    monkeypatch.chdir(project / "a")
    state = load_state()
    assert state.last_profile == str(project / "profiles" / "p.json")
    assert state.history[0].profile == str(project / "profiles" / "p.json")


def test_status_from_a_subfolder_prints_the_absolute_path(project, monkeypatch):
    save_state(State(enabled=["bf16-gemm"]), project / ".dsv4opt" / "state.json")
    monkeypatch.chdir(project / "a" / "b")
    r = CliRunner().invoke(app, ["status"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert f"state: {project / '.dsv4opt' / 'state.json'}" in r.output
    assert "on: bf16-gemm" in r.output
