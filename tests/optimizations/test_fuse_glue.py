"""fuse-glue: each fused region (Triton, under the interpreter on a CPU) against its float64
definition over awkward shapes, the eager baseline against the same definition, and a gate that
fails on broken regions."""

from __future__ import annotations

import importlib

import pytest
import torch

from dsv4opt.numerics import INT_POISON, error_report, nan_poisoned_allocations
from dsv4opt.optimizations.fuse_glue import cases
from dsv4opt.optimizations.registry import get, implementations
from dsv4opt.workload import glue
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.kernels.moe import mxfp4_slot_gemv

check_module = importlib.import_module("dsv4opt.optimizations.fuse_glue.check")
kernel = pytest.importorskip("dsv4opt.optimizations.fuse_glue.kernel")
interpreted = pytest.mark.skipif(
    type(kernel._combine_reduce_kernel).__name__ != "InterpretedFunction" and not torch.cuda.is_available(),
    reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
ACT = torch.bfloat16 if DEV == "cuda" else torch.float16
SMALL_MODEL = check_module.ModelSettings("dsv4-tiny", concurrency=2, context=40, steps=1, layers=1)


@interpreted
@pytest.mark.parametrize("case", cases.interpreter_cases(), ids=lambda c: c.id)
def test_fused_region_and_eager_glue_match_the_float64_definition(case):
    fused = check_module.region_impls(kernel.IMPLEMENTATIONS)
    row = check_module.run_case(case, fused[case.region], torch.device(DEV), ACT, seed=3)
    assert row["passed"], row


@interpreted
def test_combine_never_reads_the_slots_of_other_ranks():
    """Other ranks' slots may hold anything, NaN included: the fused combine zeroes them by not
    reading them (the eager path multiplies by zero, which a NaN survives)."""
    case = cases.GlueCase("moe_combine", "nan-elsewhere", 4, 96, k=3, mine=0.5, every_expert=True)
    down, invalid, gates, scale = cases.make_args(case, DEV, ACT, torch.Generator().manual_seed(0))
    assert invalid.any() and (~invalid).any()
    down[invalid] = float("nan")
    ref = naive.moe_combine(down.double(), invalid, gates.double(), scale)
    out = kernel.moe_combine(down, invalid, gates, scale)
    assert error_report(out, ref).ok(2e-3), error_report(out, ref)
    assert torch.isnan(glue.moe_combine_eager(down, invalid, gates, scale).float()).any()


@interpreted
def test_an_unwritten_bool_or_index_is_caught():
    """The gate's poison reaches integer and bool outputs: a set-up that forgets the last slot's mask fails."""
    case = cases.GlueCase("moe_slots", "forgetful", 9, 0, k=3)

    def forgetful(local_ids):
        experts, rows, invalid, slots = kernel.moe_slots(local_ids)
        fresh = torch.empty_like(invalid)
        fresh[:-1] = invalid[:-1]
        return experts, rows, fresh, slots

    with nan_poisoned_allocations(ints=True):
        t = torch.empty(5, dtype=torch.bool)
    assert (t.view(torch.uint8) == INT_POISON).all()
    row = check_module.run_case(case, forgetful, torch.device(DEV), ACT)
    assert not row["passed"] and row["mismatches"] >= 1


def _routed(slots=kernel.moe_slots, act=None, combine=kernel.moe_combine):
    """fuse-glue's routed experts with one piece swapped."""
    def run(x, local_ids, gates, w13, w2, limit, scale):
        experts, rows, invalid, slot_rows = slots(local_ids)
        inter = mxfp4_slot_gemv(x, rows, experts, w13.packed, w13.scales)
        a = act(inter, limit) if act else kernel.silu_mul_clamp(inter, limit)
        down = mxfp4_slot_gemv(a, slot_rows, experts, w2.packed, w2.scales)
        return combine(down, invalid, gates, scale)
    return run


def _broken(slot: str):
    """A plausible mistake in each slot: the RMS factor lost; every row's experts read from rank 0's
    map; SGLang's clamp lost in the activation (routed_experts)."""
    good = dict(kernel.IMPLEMENTATIONS)
    if slot == "hc_split_sum":
        return {**good, slot: lambda mix, rsqrt, *rest: kernel.hc_split_sum(mix, torch.ones_like(rsqrt), *rest)}
    if slot == "moe_local":
        return {**good, slot: lambda ids, owner, rank: kernel.moe_local(ids, owner, torch.zeros_like(rank))}
    return {**good, slot: _routed(act=lambda inter, limit: kernel.silu_mul_clamp(inter, 1e9))}


def test_the_gate_passes_the_real_regions_in_the_model(torch_path):
    result = check_module.run_check(torch.device("cpu"), dict(kernel.IMPLEMENTATIONS), model=SMALL_MODEL)
    assert result.passed, result.summary
    # attention and MoE blocks, in each layout
    assert result.figures["blocks"] == 2 * SMALL_MODEL.layers * SMALL_MODEL.steps * len(check_module.LAYOUTS)
    assert result.figures["block_rel_worst"] < 1e-5  # float32 on the CPU: the rounding of one reduction


@pytest.mark.parametrize("slot", cases.SLOTS)
def test_the_gate_fails_a_broken_region(torch_path, slot):
    result = check_module.run_check(torch.device("cpu"), _broken(slot), model=SMALL_MODEL)
    assert not result.passed
    assert "FAILED" in result.summary


def test_the_gate_fails_a_combine_that_lets_other_ranks_slots_through(torch_path):
    through = lambda down, invalid, *rest: kernel.moe_combine(down, torch.zeros_like(invalid), *rest)  # noqa: E731
    result = check_module.run_check(torch.device("cpu"), {**kernel.IMPLEMENTATIONS, "routed_experts": _routed(combine=through)},
                                    model=SMALL_MODEL)
    assert not result.passed and result.figures["routed_experts_rel_worst"] > 1e-2


def test_the_gate_fails_a_set_up_that_reads_the_wrong_rows(torch_path):
    def shifted(local_ids):
        experts, rows, invalid, slots = kernel.moe_slots(local_ids)
        return experts, (rows + 1) % local_ids.shape[0], invalid, slots

    result = check_module.run_check(torch.device("cpu"), {**kernel.IMPLEMENTATIONS, "routed_experts": _routed(slots=shifted)},
                                    model=SMALL_MODEL)
    assert not result.passed


def test_the_model_part_of_the_gate_sees_a_broken_combine(torch_path):
    """The model alone separates a broken region (SGLang's scaling inside the fallback "fixed"
    away) from the real one by orders of magnitude."""
    lost_alpha = lambda down, invalid, gates, scale: kernel.moe_combine(down, invalid, gates, 1.0)  # noqa: E731
    real = check_module.block_figures(SMALL_MODEL, torch.device("cpu"), dict(kernel.IMPLEMENTATIONS))
    broken = check_module.block_figures(SMALL_MODEL, torch.device("cpu"),
                                        {**kernel.IMPLEMENTATIONS, "routed_experts": _routed(combine=lost_alpha)})
    assert broken["block_rel_worst"] > check_module.BLOCK_TOL > 100 * real["block_rel_worst"]


def test_the_gate_refuses_a_missing_region():
    impls = dict(kernel.IMPLEMENTATIONS)
    impls.pop("moe_local")
    with pytest.raises(Exception, match="moe_local"):
        check_module.run_check(torch.device("cpu"), impls)


def test_registry_names_its_slots_and_the_eager_code_they_replace():
    opt = get("fuse-glue")
    assert set(implementations(["fuse-glue"])) == set(opt.slots) == set(cases.SLOTS)
    assert opt.env_gate == "DSV4OPT_FUSE_GLUE" and opt.target_category == "glue"
    assert set(opt.replaced_functions()) == {"hc_split_sum_eager", "moe_local_eager", "moe_slots_eager",
                                             "moe_act_eager", "moe_combine_eager", "routed_experts_sm120"}


def test_with_grouped_moe_on_the_routed_experts_are_grouped_moes():
    impls = implementations(["fuse-glue", "grouped-moe"])
    assert impls["routed_experts"] is get("grouped-moe").implementations()["routed_experts"]
    assert impls["hc_split_sum"] is kernel.hc_split_sum and impls["moe_local"] is kernel.moe_local


def test_flash_cases_route_like_the_model():
    """At dsv4-flash's shapes one row in eight is this rank's, and every expert of its rows is held here."""
    for case in cases.flash_cases(4):
        if case.region != "moe_combine":
            continue
        down, invalid, *_ = cases.make_args(case, "cpu", torch.float32, torch.Generator().manual_seed(0))
        assert float((~invalid).float().mean()) == pytest.approx(1 / 8)


def test_bench_sums_one_layer_and_shows_a_failed_check_instead_of_timings():
    from rich.console import Console

    from dsv4opt.errors import DsvOptError
    from dsv4opt.optimizations.fuse_glue import bench
    from dsv4opt.optimizations.registry import CheckResult

    passed = CheckResult("fuse-glue", True, "gpu", {}, {}, "ok", {"cases": []})
    rows = [bench.BenchRow(region=r, concurrency=32, eager_us=e, fused_us=f, bytes_moved=1, floor_us=0.1, input_sets=2)
            for r, e, f in (("hc_split_sum", 14.0, 4.0), ("moe_local", 9.0, 1.5), ("moe_slots", 4.0, 1.2),
                            ("moe_act", 52.0, 5.0), ("moe_combine", 48.0, 2.0))]
    layer = bench.BenchResult(check=passed, device="gpu", copy_gbps=4000.0, rows=rows).per_layer()[32]
    assert layer["eager_us"] == pytest.approx(2 * 14 + 9 + 4 + 52 + 48)
    assert layer["fused_us"] == pytest.approx(2 * 4 + 1.5 + 1.2 + 5 + 2)
    failed = CheckResult("fuse-glue", False, "gpu", {}, {}, "bad", {"cases": [
        {"case": "moe_act:x", "passed": False, "rel_err": 0.5, "mismatches": 0, "eager_rel_err": 1e-3}]})
    console = Console(record=True, width=120)
    console.print(bench.render(bench.BenchResult(check=failed, device="gpu")))
    text = console.export_text()
    assert "FAILED" in text and "moe_act:x" in text and "x eager" not in text
    if not torch.cuda.is_available():
        with pytest.raises(DsvOptError, match="needs a CUDA GPU"):
            bench.run_bench()
