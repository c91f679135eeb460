"""torch-compile: the blocks compiled with the kernels opaque, against the eager blocks.

Most tests compile with Dynamo and AOTAutograd only (`aot_eager`: the graphs, the opaque ops, their
fakes and the functionalised cache stores, run op by op), which reproduces eager numerics exactly and
takes seconds; one slow test runs Inductor's C++ code generation on the CPU.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch

from dsv4opt.optimizations.torch_compile import ops
from dsv4opt.optimizations.torch_compile.check import BOUNDS, GateSettings, run_check
from dsv4opt.optimizations.torch_compile.regions import CompiledRegions
from dsv4opt.workload.paths import PATHS

# One window-only layer: an attention block and a hash-routed FFN block, two graphs.
SMALL = GateSettings(config="dsv4-tiny", concurrency=2, context=24, steps=1, layers=1, bf16_report=False)
# Four layers: every kind of block (window, CSA with the indexer, HCA; hash-routed and routed FFN).
EVERY_KIND = GateSettings(config="dsv4-tiny", concurrency=3, context=40, steps=2, layers=4, bf16_report=False)


def aot_eager(**others):
    return {**others, "regions": CompiledRegions("aot_eager")}


def test_every_stand_in_takes_its_kernels_arguments():
    """Dynamo traces a stand-in wherever the model calls the kernel: same parameter names and defaults."""
    for name, kernel in ops.KERNELS.items():
        want = [(p.name, p.default) for p in inspect.signature(kernel).parameters.values()]
        got = [(p.name, p.default) for p in inspect.signature(ops.STAND_INS[name]).parameters.values()]
        assert got == want, name


@pytest.mark.slow
def test_the_hopper_path_compiles_whole_and_matches_eager(torch_path):
    """0.5.23's blocks: the fused pre step's two ops, FP8 wo_a, the path's slots opaque by contract."""
    r = run_check(torch.device("cpu"), aot_eager(), replace(EVERY_KIND, sglang="0.5.23"))
    assert r.passed, r.summary
    assert r.figures["graphs"] == 5 and r.figures["graph_breaks"] == 0, r.summary
    assert r.figures["block_rel_worst"] <= 1e-6 and r.figures["step_rel_worst"] <= 1e-6, r.summary


@pytest.mark.slow
def test_every_kind_of_block_compiles_whole_and_matches_eager(torch_path):
    r = run_check(torch.device("cpu"), aot_eager(), EVERY_KIND)
    assert r.passed, r.summary
    assert r.figures["graphs"] == 5 and r.figures["graph_breaks"] == 0, r.summary
    # aot_eager runs the same ATen ops as eager: nothing but the op order may differ
    assert r.figures["block_rel_worst"] <= 1e-6 and r.figures["step_rel_worst"] <= 1e-6, r.summary


def test_step_goes_unbounded_only_beside_an_optimisation_that_changes_selection(monkeypatch):
    import importlib

    check_mod = importlib.import_module("dsv4opt.optimizations.torch_compile.check")
    seen = []
    monkeypatch.setattr(check_mod, "run_check",
                        lambda dev, impls, settings=None, step_bounded=True: seen.append((settings.sglang, step_bounded)))
    monkeypatch.setattr(check_mod, "_together", lambda results: None)
    for others in ((), ("grouped-moe", "mma-attn"), ("mma-attn", "bf16-gemm")):
        check_mod.check("cpu", others=others)
    # every path the workload reproduces is compiled by the gate
    assert seen == [(path, bounded) for bounded in (True, True, False) for path in PATHS]


def test_a_wrong_stand_in_fails_the_gate_with_the_step_unbounded(torch_path, monkeypatch):
    """With the step figures unbounded (beside bf16-gemm) the blocks alone still catch a wrong op."""
    monkeypatch.setitem(ops.STAND_INS, "rms_norm", lambda x, weight, eps: torch.ops.dsv4opt.rms_norm(x, None, eps))
    r = run_check(torch.device("cpu"), aot_eager(), SMALL, step_bounded=False)
    assert not r.passed and "step_rel_median" not in r.bounds, r.summary
    assert r.figures["block_rel_worst"] > BOUNDS["block_rel_worst"], r.summary


def test_a_wrong_stand_in_fails_the_gate(torch_path, monkeypatch):
    """An RMS norm whose stand-in drops the weight: the compiled blocks compute something else."""
    monkeypatch.setitem(ops.STAND_INS, "rms_norm", lambda x, weight, eps: torch.ops.dsv4opt.rms_norm(x, None, eps))
    r = run_check(torch.device("cpu"), aot_eager(), SMALL)
    assert not r.passed and r.figures["block_rel_worst"] > BOUNDS["block_rel_worst"], r.summary


@torch.library.custom_op("dsv4opt_test::silu_mul_clamp_wide", mutates_args=())
def _silu_mul_clamp_wide(x: torch.Tensor, limit: float) -> torch.Tensor:
    from dsv4opt.workload.kernels.moe import silu_mul_clamp

    return silu_mul_clamp(x, limit).contiguous()


@_silu_mul_clamp_wide.register_fake
def _(x, limit):
    return x.new_empty(x.shape[0], x.shape[1] // 2 + 1)  # one column more than the kernel writes


def test_a_fake_that_lies_about_shape_fails_the_gate(torch_path, monkeypatch):
    monkeypatch.setitem(ops.STAND_INS, "silu_mul_clamp",
                        lambda x, limit: torch.ops.dsv4opt_test.silu_mul_clamp_wide(x, limit))
    r = run_check(torch.device("cpu"), aot_eager(), SMALL)
    assert not r.passed and "fake_mismatches" in r.summary, r.summary
    assert any("silu_mul_clamp_wide" in m for m in r.details["fake_mismatches"]), r.details


def test_an_optimisations_slots_are_opaque_ops_in_the_graph(torch_path):
    """bf16-gemm's, grouped-moe's and fuse-glue's kernels (their CPU paths here) enter the compiled
    blocks as slot ops, not as code Dynamo would trace or break at, and the blocks still match eager."""
    from dsv4opt.optimizations.registry import implementations

    seen: set[str] = set()

    def recording(gm, example_inputs):
        seen.update(str(n.target).removesuffix(".default") for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    # dp-ep: the local-expert map runs only there
    settings = GateSettings(config="dsv4-tiny", concurrency=2, context=24, steps=1, layers=3, bf16_report=False,
                            layout="dp-ep")
    others = implementations(["bf16-gemm", "grouped-moe", "fuse-glue"])
    r = run_check(torch.device("cpu"), {**others, "regions": CompiledRegions(recording)}, settings)
    assert r.passed and r.figures["graph_breaks"] == 0, r.summary
    assert {"dsv4opt.hc_premix_slot", "dsv4opt.indexer_logits_slot", "dsv4opt.routed_experts_slot",
            "dsv4opt.hc_split_sum_slot", "dsv4opt.moe_local_slot"} <= seen, seen


@pytest.fixture
def quick_inductor(monkeypatch):
    """Inductor's C++ backend without its vector-ISA probes and precompiled headers: the code is
    scalar, the compile several times faster; what is tested is correctness, not CPU speed."""
    import torch._inductor.config as inductor

    monkeypatch.setattr(inductor.cpp, "vec_isa_ok", False)
    monkeypatch.setattr(inductor, "cpp_cache_precompile_headers", False)
    monkeypatch.setattr(inductor, "compile_threads", 1)
    monkeypatch.setattr(inductor, "cpp_wrapper", True)  # one C++ file per graph, not one per kernel


@pytest.mark.slow
def test_inductor_compiles_the_blocks_within_fp32_rounding(torch_path, quick_inductor):
    r = run_check(torch.device("cpu"), {"regions": CompiledRegions("inductor")}, SMALL)
    assert r.passed and r.figures["graph_breaks"] == 0, r.summary
    # Inductor reorders and fuses fp32 arithmetic, so this is rounding, not zero
    assert 0 < r.figures["block_rel_worst"] <= 1e-5, r.summary


@pytest.fixture
def compiles_quickly(monkeypatch):
    """The lever's blocks compiled by aot_eager and its gate on one layer: what is under test here is
    the loop around the lever, not Inductor."""
    import importlib

    import dsv4opt.optimizations.torch_compile as lever

    monkeypatch.setitem(lever.IMPLEMENTATIONS, "regions", CompiledRegions("aot_eager"))
    monkeypatch.setattr(importlib.import_module("dsv4opt.optimizations.torch_compile.check"), "gate_settings",
                        lambda device: SMALL)
    # Dynamo keeps what it compiled per code object for the whole process: without a reset, the graphs
    # counted below depend on which tests ran before in this worker
    torch._dynamo.reset()


def test_the_env_gate_switches_it_on(monkeypatch):
    from dsv4opt.loop.enabled import enabled_optimizations

    monkeypatch.setenv("DSV4OPT_TORCH_COMPILE", "1")
    assert "torch-compile" in enabled_optimizations(use_state=False)


@pytest.mark.slow
def test_the_lever_goes_through_the_loop(torch_path, compiles_quickly, tmp_path, monkeypatch):
    """list, profile, apply (gate, switch, re-profile with the blocks compiled), revert."""
    import json

    from typer.testing import CliRunner

    from dsv4opt.cli import app
    from dsv4opt.state import load_state

    def invoke(*args):
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})

    monkeypatch.chdir(tmp_path)
    tiny = ["--config", "dsv4-tiny", "--device", "cpu", "--steps", "1", "--warmup", "1", "--context", "24",
            "--layers", "2", "--concurrency", "2"]
    listed = invoke("list")
    assert listed.exit_code == 0 and "torch-compile" in listed.output and "DSV4OPT_TORCH_COMPILE=1" in listed.output
    assert invoke("profile", *tiny).exit_code == 0
    before = json.loads(open(load_state().last_profile).read())
    assert "compile" not in before["meta"]  # nothing compiled in the baseline
    applied = invoke("apply", "torch-compile", "--keep")
    assert applied.exit_code == 0, applied.output
    assert "torch-compile on cpu: passed" in applied.output and load_state().enabled == ["torch-compile"]
    after = json.loads(open(load_state().last_profile).read())
    assert after["meta"]["optimizations"] == ["torch-compile"]
    compiled = after["meta"]["compile"]
    # The profile compiles at least one graph the gate's compiles (one layer) do not cover. How many
    # more depends on Dynamo's global-state guard, which includes torch's thread count: the CPU profile
    # runs on one thread, the gate on the process's, and where the two differ every block recompiles.
    assert compiled["graphs"] >= 1 and compiled["graph_breaks"] == 0 and compiled["first_step_s"] > 0, compiled
    assert invoke("revert", "torch-compile").exit_code == 0 and load_state().enabled == []


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.slow
def test_compiled_blocks_replay_in_a_cuda_graph():
    """Compiled in the warm-up, captured as the profile captures a step, replayed: the replays track
    an eager twin token for token, hidden state within the gate's step bound."""
    from dsv4opt.capture.rank_run import _graph_step
    from dsv4opt.numerics import error_report
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.model import DecodeWorkload

    cfg = ModelConfig.from_name("dsv4-tiny")
    kw = dict(concurrency=4, context=40, device="cuda", dtype=torch.float32, layers=4, seed=0)
    wl, twin = DecodeWorkload(cfg, impls={"regions": CompiledRegions()}, **kw), DecodeWorkload(cfg, **kw)
    compiled_tokens = torch.tensor([3, 9, 11, 17], device="cuda")
    eager_tokens = compiled_tokens.clone()

    def eager_step():
        eager_tokens.copy_(twin.step(eager_tokens).argmax(-1))

    for _ in range(2):  # the first compiles
        compiled_tokens.copy_(wl.step(compiled_tokens).argmax(-1))
        eager_step()
    replay = _graph_step(wl, compiled_tokens)
    eager_step()  # _graph_step ran one step before capturing
    for _ in range(3):
        replay()
        eager_step()
        torch.cuda.synchronize()
        assert torch.equal(compiled_tokens, eager_tokens)
        report = error_report(wl.last_hidden, twin.last_hidden)
        assert report.ok(3e-2), report  # the compiled glue's fp32 reassociation, through e4m3 roundings


@needs_cuda
@pytest.mark.slow
@pytest.mark.parametrize("others", [(), ("mma-attn", "bf16-gemm", "grouped-moe"), ("mma-attn", "bf16-gemm", "grouped-moe", "fuse-glue")],
                         ids=["baseline", "with-the-others", "with-fuse-glue-too"])
def test_the_gate_passes_on_the_gpu(others):
    from dsv4opt.optimizations.torch_compile import check

    r = check("cuda", others=others)
    assert r.passed, r.summary
    assert r.figures["graph_breaks"] == 0, r.details["break_reasons"]


def test_the_gate_leaves_out_a_path_that_cannot_run_here(monkeypatch):
    """A Hopper GPU without sgl-flash-mla: the gate compiles the default path only, and says why."""
    import importlib

    import dsv4opt.workload.attention.flashmla as flashmla
    from dsv4opt.optimizations.registry import CheckResult

    check_mod = importlib.import_module("dsv4opt.optimizations.torch_compile.check")
    seen = []

    def fake(dev, impls, settings=None, step_bounded=True):
        seen.append(settings.sglang)
        return CheckResult(name="torch-compile", passed=True, device="cpu", figures={}, bounds={}, summary="ok",
                           details={"settings": {"sglang": settings.sglang}})

    monkeypatch.setattr(check_mod, "run_check", fake)
    monkeypatch.setattr(flashmla, "missing_on", lambda device: "no sgl-flash-mla here")
    r = check_mod.check("cpu")
    assert seen == ["0.5.14"] and r.passed and "no sgl-flash-mla here" in r.notes[0]
