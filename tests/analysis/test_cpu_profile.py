"""CPU-only profiles: operators in the fixed categories, steps and parts from a real torch.profiler
trace, checked against plain sums over the trace JSON (self time of a step or part = the summed
durations of its top-level operators, which is how nesting divides a thread's time)."""

from __future__ import annotations

import json

import pytest
import torch

from dsv4opt.analysis.api import analyze_paths
from dsv4opt.analysis.categories import CATEGORIES, ELEMENTWISE, GEMM_FP32_SIMT, REDUCTION, TOPK_SORT
from dsv4opt.analysis.classify import CPU_RULES, classify_cpu_op
from dsv4opt.analysis.profile import Profile
from dsv4opt.decision.diagnose import diagnose

STEPS = 2
# Written by hand, not by the rule table: the category each named operator must land in.
EXPECTED = {"aten::bmm": GEMM_FP32_SIMT, "aten::mm": GEMM_FP32_SIMT, "aten::add": ELEMENTWISE,
            "aten::mul": ELEMENTWISE, "aten::sum": REDUCTION, "aten::topk": TOPK_SORT}


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("cpu_trace") / "cpu.trace.json"
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, 8, 16, generator=g), torch.randn(4, 16, 8, generator=g)
    w, x = torch.randn(16, 16, generator=g), torch.randn(8, 16, generator=g)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=STEPS, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule) as prof:
        for _ in range(1 + STEPS):
            with torch.profiler.record_function("attn"):
                s = torch.bmm(q, k).mul(0.25)
                torch.topk(s, 3, dim=-1)
            with torch.profiler.record_function("mlp"):
                h = torch.mm(x, w).add(1.0)
                h.sum()
            prof.step()
    prof.export_chrome_trace(str(path))
    return path


def _events(path):
    events = json.loads(path.read_text())["traceEvents"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    ranges = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    return ops, ranges


def _inside(e, r):
    return r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"] and e["tid"] == r["tid"]


def _top_level(ops):
    """Operators not nested in another operator on the same thread."""
    return [e for e in ops if not any(o is not e and _inside(e, o) and (o["dur"], -o["ts"]) > (e["dur"], -e["ts"]) for o in ops)]


def _plain_self(e, ops):
    """Duration minus that of the operators directly inside it (no operator between them)."""
    inner = [o for o in ops if o is not e and _inside(o, e) and (o["dur"], -o["ts"]) < (e["dur"], -e["ts"])]
    return e["dur"] - sum(o["dur"] for o in _top_level(inner))


def test_cpu_profile_categories_steps_parts(cpu_trace):
    ops, ranges = _events(cpu_trace)
    profile = analyze_paths([cpu_trace])
    assert profile.time_basis == "cpu_self"
    top = _top_level(ops)
    total = sum(e["dur"] for e in top)
    assert profile.total_us == pytest.approx(total, rel=1e-9)

    rows = {k.name: k for k in profile.kernels}
    for name, category in EXPECTED.items():
        calls = [e for e in ops if e["name"] == name]
        assert rows[name].category == category
        assert rows[name].count == len(calls) >= STEPS
        assert rows[name].total_us == pytest.approx(sum(_plain_self(e, ops) for e in calls), rel=1e-9, abs=1e-6)

    assert {c.category for c in profile.categories} <= set(CATEGORIES)
    for c in profile.categories:
        plain = sum(k.total_us for k in profile.kernels if k.category == c.category)
        assert c.total_us == pytest.approx(plain, rel=1e-9)
    assert sum(c.total_us for c in profile.categories) == pytest.approx(total, rel=1e-9)
    assert profile.category_share(GEMM_FP32_SIMT) > 0 and profile.category_share(ELEMENTWISE) > 0

    steps = [r for r in ranges if r["name"].startswith("ProfilerStep#")]
    assert profile.steps["source"] == "ProfilerStep" and profile.steps["count"] == len(steps) == STEPS
    per_step = [[e for e in ops if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]] for r in sorted(steps, key=lambda r: r["ts"])]
    for row, in_step in zip(profile.steps["steps"], per_step):
        assert row["launches"] == len(in_step)
        assert row["gpu_us"] == pytest.approx(sum(e["dur"] for e in _top_level(in_step)), rel=1e-9)
    assert profile.steps["launches_per_step"] == pytest.approx(sum(map(len, per_step)) / STEPS)
    assert profile.steps["gpu_us_per_step"] == pytest.approx(
        sum(e["dur"] for s in per_step for e in _top_level(s)) / STEPS, rel=1e-9)

    parts = {p.part: p for p in profile.parts}
    for part in ("attn", "mlp"):
        in_part = [e for e in ops if any(r["name"] == part and r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in ranges)]
        assert parts[part].count == len(in_part)
        assert parts[part].total_us == pytest.approx(sum(e["dur"] for e in _top_level(in_part)), rel=1e-9)
        assert parts[part].share == pytest.approx(parts[part].total_us / total, rel=1e-9)
    assert not any(p.startswith("ProfilerStep") for p in parts)
    assert not any(k.name.startswith("ProfilerStep") or k.name in ("attn", "mlp") for k in profile.kernels)


def test_saved_cpu_profile_loads_and_is_diagnosed(cpu_trace, tmp_path):
    profile = analyze_paths([cpu_trace])
    saved = Profile.load(profile.save(tmp_path / "cpu.json"))
    assert saved.time_basis == "cpu_self" and saved.categories == profile.categories
    assert saved.steps["count"] == STEPS and saved.parts == profile.parts
    d = diagnose(saved)
    assert d.cpu and d.glue.share == pytest.approx(saved.glue_share, rel=1e-9) and d.glue.share > 0


@pytest.mark.parametrize("rule", CPU_RULES, ids=lambda r: f"{r.category}:{r.example}")
def test_cpu_rule_examples_land_in_their_row(rule):
    assert classify_cpu_op(rule.example) == rule.category


@pytest.mark.parametrize("name,category", [
    ("aten::_scaled_dot_product_flash_attention", "attention"), ("aten::_grouped_mm", GEMM_FP32_SIMT),
    ("aten::add_", ELEMENTWISE), ("aten::maximum", ELEMENTWISE), ("aten::max", REDUCTION),
    ("aten::argsort", TOPK_SORT), ("aten::empty_strided", "copy"), ("aten::index_put_", "copy"),
    ("aten::native_layer_norm", REDUCTION), ("aten::view", "other"), ("not_an_aten_op", "other"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_cpu_operator_categories(name, category):
    assert classify_cpu_op(name) == category
