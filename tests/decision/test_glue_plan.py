"""Which regions fuse-glue fuses, what recommend bounds it by, and the measured against the predicted
saving, on hand-made profiles whose figures can be worked out by hand."""

from __future__ import annotations

import msgspec
import pytest

from dsv4opt.analysis.profile import GlueRegionRow, GlueRegions
from dsv4opt.decision.glue_plan import glue_outcome, glue_plan
from dsv4opt.decision.recommend import recommend
from dsv4opt.errors import DsvOptError
from tests.decision.profiles import amdahl_of, fuse_glue_on_record, make_profile

STEP_US = 10_000.0  # GPU time per step of the profiles below (10 steps)


def region(where: str, gpu: float, fused: float, launches: int, instances: int, part: str = "moe") -> GlueRegionRow:
    return GlueRegionRow(key=f"{part} | {where}", part=part, where=where, ops="", kernels="",
                         instances_per_step=instances, launches_per_step=launches, gpu_us_per_step=gpu,
                         share=gpu / STEP_US, median_kernel_us=1.0, fused_us_per_step=fused,
                         saving_us_per_step=gpu - fused, launches_saved_per_step=launches - instances,
                         estimate="launch floor")


def summary(regions: list[GlueRegionRow], glue_us: float, keyed_by: str = "source sites") -> GlueRegions:
    return GlueRegions(regions=regions, steps=10, launch_floor_us=1.0, floor_from="test", bytes_known=False,
                       keyed_by=keyed_by, glue_launches_per_step=100.0, glue_us_per_step=glue_us,
                       glue_share=glue_us / STEP_US, step_us=STEP_US,
                       saving_us_per_step=sum(r.saving_us_per_step for r in regions),
                       in_heavy_calls={"launches_per_step": 0.0, "gpu_us_per_step": 0.0},
                       rest={"regions": 0.0, "launches_per_step": 0.0, "gpu_us_per_step": 0.0, "saving_us_per_step": 0.0})


def profile_with(regions: list[GlueRegionRow], glue_us: float = 600.0, launches: float = 3000.0, **kw):
    p = make_profile([("_mxfp4_slot_gemv_kernel", "moe", 100, 10 * (STEP_US - glue_us)),
                      ("vectorized_elementwise_kernel", "elementwise", 1000, 10 * glue_us)],
                     meta={"model": "deepseek-ai/DeepSeek-V4-Flash", "concurrency": 32})
    p.glue = summary(regions, glue_us, **kw)
    p.steps = {"count": 10, "launches_per_step": launches}
    return p


MOE_ACT = region("glue.py:31 moe_act_eager", gpu=55.0, fused=1.0, launches=8, instances=1)
HC = region("glue.py:59 hc_split_sum_eager · mhc.py:77 hc_split_sinkhorn", gpu=28.0, fused=8.0, launches=10,
            instances=2, part="mhc_pre")
OTHER = region("model.py:265 _metadata", gpu=60.0, fused=1.0, launches=54, instances=1, part="embed")


def test_the_plan_takes_the_regions_of_the_code_its_slots_replace():
    plan = glue_plan(profile_with([OTHER, MOE_ACT, HC]))
    assert [r.where for r in plan.regions] == [MOE_ACT.where, HC.where] and plan.ranks == [2, 3]
    assert plan.launches_per_step == 18 and plan.launches_saved_per_step == 15
    assert plan.saving_us_per_step == pytest.approx(54.0 + 20.0)
    assert plan.share == pytest.approx(83.0 / STEP_US)
    assert plan.step_gain_bound == pytest.approx(1 / (1 - 74.0 / STEP_US))


def test_recommend_bounds_fuse_glue_by_the_share_of_the_regions_it_fuses():
    rec = recommend(profile_with([OTHER, MOE_ACT, HC]))
    fuse = {c.name: c for c in rec.candidates}["fuse-glue"]
    assert fuse.kind == "optimisation" and fuse.fits is True
    assert fuse.share == pytest.approx(83.0 / STEP_US)
    assert fuse.amdahl_bound == pytest.approx(amdahl_of(83.0 / STEP_US, fuse_glue_on_record(32)))
    assert any("fuses 2 glue regions" in n and "15 launches/step fewer" in n for n in fuse.notes)
    assert rec.chosen is not fuse  # under 1.05x: never chosen for its launches alone
    assert [r.where for r in rec.glue_regions] == [OTHER.where, MOE_ACT.where, HC.where]
    assert rec.glue_plans and rec.glue_plans[0].saving_us_per_step == pytest.approx(74.0)


@pytest.mark.parametrize("regions,keyed_by,why", [
    (None, "source sites", "holds no glue regions"),
    ([msgspec.structs.replace(MOE_ACT, where="aten::mul · aten::sum")], "operators", "keyed by operators"),
], ids=["no-regions", "no-stacks"])
def test_recommend_lists_but_never_chooses_fuse_glue_when_it_cannot_tell_what_it_fuses(regions, keyed_by, why):
    prof = make_profile([("nvjet_sm90_tst", "gemm_tc", 10, 300.0), ("elementwise_kernel", "elementwise", 10, 700.0)],
                        meta={"model": "deepseek-ai/DeepSeek-V4-Flash"})
    if regions is not None:
        prof.glue = summary(regions, 70.0, keyed_by=keyed_by)
    rec = recommend(prof)
    fuse = {c.name: c for c in rec.candidates}["fuse-glue"]
    assert fuse.fits is None and fuse.share == pytest.approx(0.7) and rec.chosen is not fuse
    assert any(line.startswith("fuse-glue would target 70.0%") and why in line for line in rec.explanation)
    assert fuse not in rec.ranked and fuse not in rec.not_applicable


def test_fuse_glue_with_none_of_its_code_among_the_regions_is_not_applicable():
    """On the 0.5.23 path fuse-glue once led the table at 1.23x, then the prose rejected it: its code
    is not on that path. It now goes to the list of what does not apply, with why, and is not ranked."""
    prof = make_profile([("nvjet_sm90_tst", "gemm_tc", 10, 300.0), ("elementwise_kernel", "elementwise", 10, 700.0)],
                        meta={"model": "deepseek-ai/DeepSeek-V4-Flash"})
    prof.glue = summary([OTHER], 70.0)
    rec = recommend(prof)
    fuse = {c.name: c for c in rec.candidates}["fuse-glue"]
    assert fuse.fits is False and fuse in rec.not_applicable and fuse not in rec.ranked and rec.chosen is not fuse
    assert fuse.why_not.startswith("none of the profile's regions comes from the code fuse-glue replaces (")
    assert not any("fuse-glue would target" in line for line in rec.explanation)
    assert {"name": "fuse-glue", "because": fuse.why_not} in rec.to_dict()["not_applicable"]


def test_outcome_measures_the_glue_removed_against_the_prediction():
    before = profile_with([OTHER, MOE_ACT, HC], glue_us=600.0, launches=3474.0)
    after = profile_with([OTHER], glue_us=600.0 - 70.0, launches=3474.0 - 15)
    outcome = glue_outcome(before, after)
    assert outcome.predicted_saving_us_per_step == pytest.approx(74.0)
    assert outcome.measured_saving_us_per_step == pytest.approx(70.0)
    assert outcome.of_prediction == pytest.approx(70.0 / 74.0)
    assert (outcome.launches_per_step_before, outcome.launches_per_step_after) == (3474.0, 3459.0)


def test_outcome_needs_regions_on_both_sides():
    before = profile_with([MOE_ACT])
    after = make_profile([("k", "elementwise", 1, 1.0)])
    with pytest.raises(DsvOptError, match="holds no glue regions"):
        glue_outcome(before, after)
