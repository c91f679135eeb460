"""An optimisation is one package: one registered at runtime from tests/ is listed, gated, applied,
benched and reverted through the CLI with no edit outside its folder."""

import json

import pytest
from typer.testing import CliRunner

import tests.optimizations.toy_premix as toy
from dsv4opt.cli import app
from dsv4opt.optimizations.registry import Optimization, register, unregister
from dsv4opt.state import load_state

runner = CliRunner()
TINY = ["--config", "dsv4-tiny", "--device", "cpu", "--steps", "1", "--warmup", "0", "--context", "24"]


@pytest.fixture
def toy_registered(torch_path):
    register(Optimization(
        name=toy.NAME, target_category="gemm_fp32_simt", replaces="the fp32 pre-mix, in float64",
        slots=("hc_premix",), env_gate="DSV4OPT_TOY_PREMIX", risk="none: more precise",
        changes_selection=False, needs_graph=False, module="tests.optimizations.toy_premix",
    ))
    yield
    unregister(toy.NAME)


def invoke(*args):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.mark.slow
def test_a_package_registered_at_runtime_goes_through_the_whole_loop(toy_registered, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    listed = invoke("list")
    assert listed.exit_code == 0 and toy.NAME in listed.output and "DSV4OPT_TOY_PREMIX=1" in listed.output
    assert invoke("profile", "--concurrency", "2", *TINY).exit_code == 0
    applied = invoke("apply", toy.NAME, "--keep")
    assert applied.exit_code == 0, applied.output
    assert "toy-premix rel" in applied.output and load_state().enabled == [toy.NAME]
    after = json.loads(open(load_state().last_profile).read())
    assert after["meta"]["optimizations"] == [toy.NAME]
    benched = invoke("bench", toy.NAME, "--json", str(tmp_path / "b.json"))
    assert benched.exit_code == 0, benched.output
    assert json.loads((tmp_path / "b.json").read_text())["bench"] == "toy-premix"
    assert invoke("revert", toy.NAME).exit_code == 0 and load_state().enabled == []


def test_its_gate_can_fail(toy_registered, monkeypatch):
    monkeypatch.setattr(toy, "BROKEN", True)
    r = invoke("apply", toy.NAME, "--no-reprofile")
    assert r.exit_code == 1 and "correctness check failed" in r.output
    assert load_state().enabled == []
