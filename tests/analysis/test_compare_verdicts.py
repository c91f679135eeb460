"""The compare verdict names what happened, on the committed H200 profiles: a category's share under
the category, a kernel's under the kernel, and across concurrencies a speed judged on tokens/s."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from dsv4opt.analysis.compare import compare_profiles
from dsv4opt.analysis.profile import Profile
from dsv4opt.cli import app
from tests.helpers import EVIDENCE_PROFILES

PROFILES = EVIDENCE_PROFILES
C1_BASELINE = PROFILES / "embedded-dsv4-flash-c1-ctx8192-baseline.json"
C1_ALL_THREE = PROFILES / "embedded-dsv4-flash-c1-ctx8192-mma-attn+bf16-gemm+grouped-moe.json"
C32_BASELINE = PROFILES / "embedded-dsv4-flash-c32-ctx8192-baseline.json"
C32_GROUPED = PROFILES / "embedded-dsv4-flash-c32-ctx8192-grouped-moe.json"


def _shares(path):
    """(MoE's share, the #1 kernel's name, category and share), read from the file by hand."""
    import json

    data = json.loads(path.read_text())
    moe = sum(c["share"] for c in data["categories"] if c["category"] == "moe")
    top = max(data["kernels"], key=lambda k: k["total_us"])
    return moe, top


def test_moe_still_first_is_said_so_and_the_kernel_share_stays_with_the_kernel():
    verdict = compare_profiles(Profile.load(C1_BASELINE), Profile.load(C1_ALL_THREE)).verdict
    before, _ = _shares(C1_BASELINE)
    after, top = _shares(C1_ALL_THREE)
    assert top["category"] == "moe"  # the #1 kernel is an MoE kernel: the case that read "new #1: MoE 26.2%"
    assert verdict.startswith(f"MoE still #1 but down from {100 * before:.1f}% to {100 * after:.1f}%")
    assert f"#1 kernel {top['short_name']} (MoE) {100 * top['share']:.1f}%" in verdict
    assert "bottleneck moved" not in verdict and "new #1" not in verdict
    # every percentage printed right after "MoE" is MoE's own share
    for share in re.findall(r"MoE (\d+\.\d)%", verdict):
        assert share in (f"{100 * before:.1f}", f"{100 * after:.1f}")


def test_a_new_first_category_is_named_with_its_own_share():
    verdict = compare_profiles(Profile.load(C32_BASELINE), Profile.load(C32_GROUPED)).verdict
    import json

    data = json.loads(C32_GROUPED.read_text())
    first = max(data["categories"], key=lambda c: c["total_us"])
    assert first["category"] == "attention"
    assert verdict.startswith("bottleneck moved: MoE ")
    assert f"#1 category now attention {100 * first['share']:.1f}%" in verdict


def test_across_concurrency_the_speed_is_judged_on_tokens_per_s():
    """C = 1 -> 32 with --force: the C = 32 step is 27x longer but decodes 32 tokens, not 1; tokens/s
    rose 20%, which once read "0.04x, SLOWER"."""
    a, b = Profile.load(C1_BASELINE), Profile.load(C32_BASELINE)
    tps_a, tps_b = a.throughput["tokens_per_s"], b.throughput["tokens_per_s"]
    change = compare_profiles(a, b).change
    assert change.on_tokens and change.verdict == "faster"
    assert abs(change.speedup - tps_b / tps_a) < 1e-6
    r = CliRunner().invoke(app, ["compare", str(C1_BASELINE), str(C32_BASELINE), "--force"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert f"tokens/s {tps_a:.2f} -> {tps_b:.2f}: {tps_b / tps_a:.2f}x, faster" in flat
    assert "SLOWER" not in flat and "0.04x" not in flat
    assert "a step decodes 1 token before, 32 tokens after" in flat


def test_across_concurrency_without_tokens_per_s_there_is_no_verdict():
    a, b = Profile.load(C1_BASELINE), Profile.load(C32_BASELINE)
    a.throughput = {"ms_per_step": a.throughput["ms_per_step"]}
    change = compare_profiles(a, b).change
    assert change.verdict == "not judged" and change.speedup is None and not change.slower
    assert "no verdict" in change.line()


def test_another_layout_with_the_same_tokens_a_step_is_judged_on_ms_per_step():
    """The dp-ep baseline (one rank, 32 requests) against the tp4 one (32 requests): both steps decode
    32 tokens, so ms/step is the speed and no tokens/s detour is announced."""
    a = Profile.load(C32_BASELINE)
    b = Profile.load(PROFILES / "layouts" / "embedded-dsv4-flash-c32-ctx8192-tp4-baseline.json")
    change = compare_profiles(a, b).change
    assert not change.on_tokens
    assert abs(change.speedup - a.throughput["ms_per_step"] / b.throughput["ms_per_step"]) < 1e-12
