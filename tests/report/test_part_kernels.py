"""analyze names the baseline's kernel in each part where the profile records it (the Hopper path),
so a share that belongs to one of our stand-ins is not read as SGLang's."""

from __future__ import annotations

import io

from rich.console import Console

from dsv4opt.analysis.profile import Profile
from dsv4opt.report.tables import print_part_kernels
from tests.helpers import REPO

HOPPER_C32 = REPO / "evidence/h200/profiles/hopper-0.5.23/embedded-dsv4-flash-c32-baseline-20261204-033223.json"


def _printed(meta_kernels) -> str:
    prof = Profile.load(HOPPER_C32)
    prof.meta["kernels"] = meta_kernels
    out = io.StringIO()
    print_part_kernels(prof, Console(file=out, width=200))
    return out.getvalue()


def test_stand_ins_are_counted_and_named():
    text = _printed({"moe": "SGLang 0.5.23: Marlin moe_wna16_marlin_gemm",
                     "qkv": "stand-in: Triton block-FP8 GEMM (for DeepGEMM fp8_gemm_nt)"})
    assert text.splitlines() == [
        "baseline kernel by part (1 of 2 parts run a stand-in, in whole or in part: those shares are partly ours, "
        "not SGLang's):",
        "  moe: SGLang 0.5.23: Marlin moe_wna16_marlin_gemm",
        "  qkv: stand-in: Triton block-FP8 GEMM (for DeepGEMM fp8_gemm_nt)",
    ]


def test_all_real_and_unrecorded():
    assert _printed({"moe": "SGLang 0.5.23: Marlin moe_wna16_marlin_gemm"}).splitlines()[0] == "baseline kernel by part:"
    assert _printed({}) == "" and _printed(None) == ""


def test_a_profile_from_before_the_record_compares_as_the_stand_ins_it_ran():
    """The committed Hopper profiles predate meta["kernels"]: they ran our stand-ins (FlashMLA itself on
    the H200), so compare refuses them beside a profile of SGLang's kernels and takes them beside a
    `--kernels stand-in` one."""
    import pytest

    from dsv4opt.analysis.compare import require_comparable
    from dsv4opt.errors import DsvOptError
    from dsv4opt.workload.production.choice import KernelChoice

    old, real, ours = (Profile.load(HOPPER_C32) for _ in range(3))
    assert "kernels" not in old.meta
    real.meta["kernels"] = KernelChoice(deep_gemm=True, marlin=True, mhc=True, flashmla=True).parts()
    ours.meta["kernels"] = KernelChoice(flashmla=True).parts()
    with pytest.raises(DsvOptError, match="kernels.moe: stand-in: Triton grouped MXFP4 MoE"):
        require_comparable(old, real)
    assert require_comparable(old, ours) == []
