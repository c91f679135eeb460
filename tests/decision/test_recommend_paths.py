"""recommend on the committed profiles of both SGLang paths: the table ranks only what applies, what
cannot apply is listed apart with why, and the figure quoted for a lever is the one measured against
the kernel it replaces on that path (never another path's)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dsv4opt.analysis.profile import Profile
from dsv4opt.cli import app
from dsv4opt.decision.recommend import amdahl, recommend
from tests.helpers import REPO

HOPPER_C32 = REPO / "evidence/h200/profiles/hopper-0.5.23/embedded-dsv4-flash-c32-baseline-20261204-033223.json"
SM120_C32 = REPO / "evidence/h200/profiles/layouts/campaign/embedded-dsv4-flash-c32-baseline-20261204-112517.json"
PEERS = REPO / "evidence/h200/mma_attn_peers_4ee4add.json"


def _flashmla_over_slot(batch: int) -> float:
    """FlashMLA 1.0.0's time over the drop-in's in SGLang's slot, read from the bench's own output."""
    row = next(r for r in json.loads(PEERS.read_text())["peers"]["rows"] if r["batch"] == batch)
    return row["us"]["FlashMLA 1.0.0"] / row["us"]["mma-attn slot"]


def test_on_the_hopper_path_only_what_applies_is_ranked():
    rec = recommend(Profile.load(HOPPER_C32))
    assert {c.name for c in rec.not_applicable} == {"bf16-gemm", "fuse-glue"}
    assert not {"bf16-gemm", "fuse-glue"} & {c.name for c in rec.ranked}
    why = {c.name: c.why_not for c in rec.not_applicable}
    assert why["bf16-gemm"].startswith("already upstream in SGLang 0.5.23 (Hopper (sm_90): ")
    assert why["fuse-glue"].startswith("none of the profile's regions comes from the code fuse-glue replaces")


def test_on_the_hopper_path_mma_attn_is_bounded_by_its_figure_against_flashmla():
    prof = Profile.load(HOPPER_C32)
    mma = {c.name: c for c in recommend(prof).candidates}["mma-attn"]
    attn = sum(p.share for p in prof.parts if p.part == "attn")
    assert mma.kernel_speedup == pytest.approx(_flashmla_over_slot(32))
    assert mma.amdahl_bound == pytest.approx(1 / (1 - attn + attn / _flashmla_over_slot(32)))
    assert "against FlashMLA 1.0.0" in mma.speedup_source and "122.9" not in mma.speedup_source
    assert mma.measured_on == "0.5.23 sm_90"


def test_on_the_sm120_path_the_record_against_sglang_0_5_14_stays():
    prof = Profile.load(SM120_C32)
    rec = recommend(prof)
    mma = {c.name: c for c in rec.candidates}["mma-attn"]
    assert rec.chosen is mma and not rec.not_applicable
    assert "122.9x on record" in mma.speedup_source
    attn = sum(p.share for p in prof.parts if p.part == "attn")
    assert mma.amdahl_bound == pytest.approx(amdahl(attn, None))


def test_a_path_with_no_figure_of_its_own_says_so(monkeypatch):
    from dsv4opt.decision.recommend import measured_kernel_speedup
    from dsv4opt.optimizations.registry import get

    speedup, source = measured_kernel_speedup(get("grouped-moe"), 32, "0.5.23 sm_90")
    assert speedup is None and source == ("not measured on this path (SGLang 0.5.23 sm_90): bound assumes the target "
                                          "takes no time")


def test_the_printed_recommendation_lists_what_does_not_apply_after_the_table():
    r = CliRunner().invoke(app, ["recommend", str(HOPPER_C32)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    table = lines[:lines.index("Not applicable here, because:")]
    assert not any(line.startswith(("bf16-gemm", "fuse-glue")) for line in table)
    assert any(line.startswith("  bf16-gemm already upstream in SGLang 0.5.23") for line in lines)
    assert "122.9" not in r.output and "measured 1.18x against FlashMLA 1.0.0" in r.output


@pytest.mark.parametrize("moe", ["SGLang 0.5.23: Marlin moe_wna16_marlin_gemm", "stand-in: Triton grouped MXFP4 MoE"])
def test_grouped_moe_is_weighed_against_marlin_only_where_marlin_ran(moe):
    """Where the profile's MoE ran SGLang's own Marlin kernel grouped-moe competes with it, quoting
    what was measured against Marlin; where our stand-in ran, it stays 'already upstream'."""
    from dsv4opt.decision.recommend import _upstream_on_path
    from dsv4opt.optimizations.registry import get

    prof = Profile.load(HOPPER_C32)
    prof.meta["kernels"] = {"moe": moe}
    why = _upstream_on_path(prof, get("grouped-moe"))
    grouped = {c.name: c for c in recommend(prof).candidates}.get("grouped-moe")
    if moe.startswith("SGLang"):
        assert why is None
        assert any(n.startswith("measured against Marlin's own moe_wna16_marlin_gemm") for n in grouped.notes)
        assert grouped.why_not is None or "upstream" not in grouped.why_not
        # at parity with Marlin's GEMMs from C = 16: never chosen on a bound that assumes the MoE takes no time
        rec = recommend(prof)
        assert grouped.fits is None and (rec.chosen is None or rec.chosen.name != "grouped-moe")
    else:  # our grouped kernel is the MoE already: nothing to propose
        assert why.startswith("grouped-moe: already upstream in SGLang 0.5.23")
        assert grouped is None
