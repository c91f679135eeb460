"""The profile on disk: every committed profile still loads, what is written reads back the same,
and readers of the /1 field names keep finding them."""

from __future__ import annotations

import json
import math

import pytest

from dsv4opt.analysis import analyze_paths
from dsv4opt.analysis.profile import SCHEMA, KernelRow, Profile
from dsv4opt.analysis.sweep import SWEEP_SCHEMA, summary_rows
from tests.helpers import EVIDENCE_PROFILES

COMMITTED = sorted(EVIDENCE_PROFILES.rglob("*.json"))
PROFILES = [p for p in COMMITTED if json.loads(p.read_text()).get("schema") == SCHEMA]
SWEEPS = [p for p in COMMITTED if json.loads(p.read_text()).get("schema") == SWEEP_SCHEMA]


def _id(path) -> str:
    return str(path.relative_to(EVIDENCE_PROFILES))


def test_the_committed_files_are_all_profiles_or_sweep_summaries():
    assert PROFILES and SWEEPS and len(PROFILES) + len(SWEEPS) == len(COMMITTED)


@pytest.mark.parametrize("path", PROFILES, ids=map(_id, PROFILES))
def test_every_committed_profile_loads_with_its_figures(path, tmp_path):
    raw = json.loads(path.read_text())
    profile = Profile.load(path)
    assert profile.total_us == raw["gpu_time_us"]  # written before total_us existed
    assert [k.name for k in profile.kernels] == [k["name"] for k in raw["kernels"]]
    assert [k.total_us for k in profile.kernels] == [k["total_us"] for k in raw["kernels"]]
    assert [(c.category, c.share) for c in profile.categories] == [(c["category"], c["share"]) for c in raw["categories"]]
    assert [p.part for p in profile.parts or []] == [p["part"] for p in raw.get("parts", [])]
    assert profile.meta == raw["meta"] and profile.steps == raw.get("steps") and profile.throughput == raw.get("throughput")
    again = Profile.load(profile.save(tmp_path / path.name))
    assert again == profile


@pytest.mark.parametrize("path", SWEEPS, ids=map(_id, SWEEPS))
def test_every_committed_sweep_summary_loads(path):
    raw = json.loads(path.read_text())
    rows = summary_rows(raw, str(path))
    assert [(r.concurrency, r.variant, r.profile) for r in rows] == [
        (r["concurrency"], r["variant"], r["profile"]) for r in raw["rows"]]


def test_written_profile_keeps_the_version_1_names_and_unknown_keys(tmp_path):
    data = json.loads(PROFILES[0].read_text())
    data["written_by_another_tool"] = {"x": 1}
    loaded = Profile.from_dict(data)
    written = json.loads(loaded.save(tmp_path / "p.json").read_text())
    assert written["schema"] == SCHEMA
    assert written["total_us"] == written["gpu_time_us"] == data["gpu_time_us"]
    assert written["written_by_another_tool"] == {"x": 1}
    assert "cpu_self_us" not in written  # only a CPU-only profile has it
    for old, new in zip(data["kernels"], written["kernels"]):
        assert {k: v for k, v in old.items() if v is not None} == new  # same names, a null is left out


def test_cpu_only_profile_names_its_total_for_what_it_is(tmp_path):
    ops = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 4},
           {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10, "dur": 1.5}]
    trace = tmp_path / "cpu.json"
    trace.write_text(json.dumps({"traceEvents": ops}))
    written = json.loads(analyze_paths([trace]).save(tmp_path / "p.json").read_text())
    assert written["time_basis"] == "cpu_self"
    assert written["total_us"] == written["cpu_self_us"] == written["gpu_time_us"] == 5.5


def test_display_name_and_labels_come_with_the_row():
    row = KernelRow(name="void at::native::f<float>(int)", category="gemm_tc", count=1, total_us=1.0, share=1.0)
    assert row.display_name == row.name and row.category_label == "tensor-core GEMM"
    named = KernelRow(name=row.name, short_name="f<float>", category="topk_sort", count=1, total_us=1.0, share=1.0)
    assert named.display_name == "f<float>" and named.category_label == "top-k/sort"
    profile = Profile.load(PROFILES[0])
    assert profile.top_category.label and math.isclose(sum(c.share for c in profile.categories), 1.0, rel_tol=1e-6)
