"""Every H200 profile committed under evidence/h200/profiles/ (top level and subfolders) works with every command that
reads a profile: analyze (to view it), recommend, compare, report and glue. A profile written
before the format grew loads with the new fields absent; one that keeps no glue regions (written
before they existed, its trace not kept) gets its glue kernels and the one line that says what is
missing and what to run."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsv4opt.cli import app
from tests.helpers import EVIDENCE_PROFILES

runner = CliRunner()


def _committed() -> list:
    return sorted(p for p in EVIDENCE_PROFILES.rglob("*.json")
                  if json.loads(p.read_text()).get("schema") == "dsv4opt.profile/1")


PROFILES = _committed()


def test_every_committed_profile_is_listed():
    assert len(PROFILES) >= 60  # 17 at the top, 15 in fuse-glue/, the archive's
    assert {p.parent.name for p in PROFILES} >= {"profiles", "fuse-glue", "archive", "sweep", "mma_attn_r2"}


def invoke(*args):
    r = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "80"})
    assert r.exit_code == 0, f"{args[0]}: {r.output}"
    assert "Traceback" not in r.output
    return r.output


@pytest.mark.parametrize("path", PROFILES, ids=[str(p.relative_to(EVIDENCE_PROFILES)) for p in PROFILES])
def test_each_command_reads_it(path, tmp_path):
    data = json.loads(path.read_text())
    top = max(data["kernels"], key=lambda k: k["total_us"])
    shown = invoke("analyze", path, "--top", "3")
    assert f"{100 * top['share']:.1f}%" in shown and "categories" in shown
    assert "profile:" in invoke("recommend", path)
    assert "bottleneck did not move" in invoke("compare", path, path)
    glue = " ".join(invoke("glue", path, "--json", tmp_path / "g.json").split())
    written = json.loads((tmp_path / "g.json").read_text())
    if "glue" in data:
        assert "glue regions by saving" in glue and written["glue"]["regions"]
        return
    meta = data["meta"]
    line = (f"{path}: no glue regions (written before profiles kept them; its trace was not kept): the kernels above "
            "are its kernel table's, without the order of launches that regions and their saving need; for them on a "
            f"GPU run `dsv4opt profile -c {meta['concurrency']} --context {meta['context']} ")
    assert line in glue
    assert written["glue"] is None and written["kernels"]["missing"].startswith(line)
    with_ = meta.get("optimizations") or []
    assert (f"--with {','.join(with_)}`" in glue) == bool(with_)
    glue_us = sum(k["total_us"] for k in data["kernels"] if k["category"] in ("elementwise", "reduction", "copy",
                                                                                "topk_sort", "other"))
    assert abs(written["kernels"]["gpu_us_per_step"] - glue_us / data["steps"]["count"]) < 1e-6 * glue_us


def test_one_report_reads_them_all(tmp_path):
    """report is the command that reads every field; one page over all of them (charts and all)."""
    invoke("report", *PROFILES, "--out", tmp_path / "r.md")
    page = (tmp_path / "r.md").read_text()
    assert page.startswith("# dsv4opt report") and f"from {len(PROFILES)} profile" in page


def test_glue_on_a_profile_with_fuse_glue_on_says_so():
    """It said "none of the profile's regions comes from the code fuse-glue replaces"."""
    path = EVIDENCE_PROFILES / "fuse-glue" / "embedded-dsv4-flash-c32-ctx8192-mma-attn+bf16-gemm+grouped-moe+fuse-glue.json"
    text = " ".join(invoke("glue", path).split())
    assert "fuse-glue is already on in this profile" in text and "none of the profile's regions" not in text
