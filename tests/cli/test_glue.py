"""`dsv4opt glue` and the glue sections of recommend and report, on the real H200 trace."""

from __future__ import annotations

import json

import msgspec
import pytest
from typer.testing import CliRunner

from dsv4opt.analysis.profile import CategoryRow, KernelRow, Profile
from dsv4opt.cli import app
from dsv4opt.display import duration
from tests.helpers import DATA, FIXTURE_PROFILES, REPO

GRAPH = DATA / "h200-dsv4flash-faithful-l4-c32-graph.trace.json.gz"
EAGER = DATA / "h200-dsv4flash-faithful-l4-c32-eager.trace.json.gz"
runner = CliRunner()


def invoke(*args: str, columns: int = 80):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": str(columns)})


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    path = tmp_path_factory.mktemp("glue") / "profile.json"
    r = invoke("analyze", GRAPH, "--capture", EAGER, "--json", path)
    assert r.exit_code == 0, r.output
    return path


def test_glue_on_a_trace_fits_80_columns_and_never_cuts_a_number(tmp_path):
    out = tmp_path / "glue.json"
    r = invoke("glue", GRAPH, "--capture", EAGER, "--top", "8", "--json", out)
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    data = json.loads(out.read_text())
    assert data["schema"] == "dsv4opt.glue/1" and data["plan"]["optimisation"] == "fuse-glue"
    rows = [line for line in r.output.splitlines() if line.strip()[:2].strip().isdigit() and "µs" in line]
    assert len(rows) == 8
    for line, region in zip(rows, data["glue"]["regions"]):
        for figure in ("gpu_us_per_step", "fused_us_per_step", "saving_us_per_step", "median_kernel_us"):
            assert duration(region[figure]) in line, (figure, line)
    assert "the step gains at most" in r.output  # the bound, said plainly
    again = invoke("glue", GRAPH, "--capture", EAGER, "--json", out)
    assert again.exit_code == 1 and "--force" in again.output


def test_glue_on_a_profile_reads_the_regions_it_holds(analysed, tmp_path):
    out = tmp_path / "glue.json"
    r = invoke("glue", analysed, "--json", out)
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["glue"] == msgspec.to_builtins(Profile.load(analysed).glue)
    refused = invoke("glue", analysed, "--capture", EAGER)
    assert refused.exit_code == 1 and "--capture goes with trace files" in refused.output


def test_glue_on_a_profile_without_regions_says_how_to_get_them(tmp_path):
    """A profile written before regions were kept: its glue kernels, and the line that says what is
    missing and what to run (the profile again for a capture, glue on its traces for an analysis)."""
    old = FIXTURE_PROFILES / "embedded-dsv4-flash-c32-ctx8192-baseline.json"
    r = invoke("glue", old)
    assert r.exit_code == 0, r.output
    assert "no glue regions" in r.output and "`dsv4opt profile -c 32 --context 8192" in " ".join(r.output.split())
    analysed = Profile.load(old)
    analysed.glue, analysed.meta = None, {"target": "trace", "sources": ["run/rank0.trace.json"]}
    r = invoke("glue", analysed.save(tmp_path / "p.json"))
    assert r.exit_code == 0, r.output
    assert "run `dsv4opt glue` on its trace file (run/rank0.trace.json; with --capture EAGER" in " ".join(r.output.split())


def test_glue_on_a_cpu_profile_says_regions_are_gpu_launches(tmp_path):
    path = Profile(meta={"target": "embedded"}, total_us=10.0, time_basis="cpu_self",
                   kernels=[KernelRow(name="aten::mm", category="gemm_fp32_simt", count=1, total_us=10.0, share=1.0)],
                   categories=[CategoryRow(category="gemm_fp32_simt", count=1, total_us=10.0, share=1.0)]).save(tmp_path / "cpu.json")
    r = invoke("glue", path)
    assert r.exit_code == 1 and "GPU launches" in r.output


def test_recommend_and_report_show_the_glue_regions(analysed, tmp_path):
    r = invoke("recommend", analysed)
    assert r.exit_code == 0, r.output
    assert "Glue worth fusing" in r.output and "fuse-glue" in r.output
    page = tmp_path / "report.md"
    r = invoke("report", analysed, "--out", page)
    assert r.exit_code == 0, r.output
    text = page.read_text()
    assert "## Glue regions of the last profile" in text and "the step gains at most" in text
    assert "model.py:400 routed_experts_sm120" in text
