"""indexer-topk: the kernels (Triton's interpreter, fp16 operands) against the slot's float64
definition over awkward shapes, the baseline slot unchanged, the gate and what makes it fail, the
model calling the slot, the registry and recommend, and the bench's CPU refusal and bytes."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dsv4opt.errors import DsvOptError
from dsv4opt.numerics import INT_POISON, nan_poisoned_allocations
from dsv4opt.optimizations.indexer_topk import cases, kernel, naive
from dsv4opt.optimizations.registry import get, implementations
from dsv4opt.workload import baseline
from dsv4opt.workload.kernels.indexer import select_topk, topk_transform

check_module = importlib.import_module("dsv4opt.optimizations.indexer_topk.check")
bench = importlib.import_module("dsv4opt.optimizations.indexer_topk.bench")
interpreted = pytest.mark.skipif(type(kernel._fused_kernel).__name__ != "InterpretedFunction" and not torch.cuda.is_available(),
                                 reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TIE = check_module.TIE_REL["fp8" if DEV.type == "cuda" else "exact"]
SMALL = [c for c in cases.interpreter_cases() if not c.name.startswith("flash")]
POISONED = INT_POISON * 0x01010101  # an int32 output element nobody wrote


def _inputs(case, seed=0):
    return cases.make_inputs(case, DEV, seed)


def _judged(out, inp, tie=TIE):
    _, scores, abs_sum = naive.reference(*cases.args(inp))
    return check_module.judge(out, inp["seq_lens"], inp["base"], inp["topk"], scores, abs_sum, tie)


def _ok(got):
    assert not got["malformed"].any(), got
    assert (got["gap"] == 0).all(), got


# ---- the reference -------------------------------------------------------------------------------

def test_reference_is_the_top_k_by_plain_sorting():
    """naive.index_topk against a hand-sorted list: highest first, ties by lower entry, -1 padded,
    a short request's entries all kept in order."""
    q8 = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]] * 2)
    w = torch.tensor([[1.0, 2.0]] * 2)
    keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [2.0, -1.0], [0.0, 0.5], [1.0, 0.0]]] * 2)
    scales = torch.ones(2, 5)
    lens = torch.tensor([5, 2])
    out = naive.index_topk(q8, w, keys, scales, lens, torch.tensor([10, 20]), 3)
    # scores of request 0: [1, 2, 2, 1, 1] -> 2 (entry 1), 2 (entry 2), then the first 1 (entry 0)
    assert out.tolist() == [[11, 12, 10], [20, 21, -1]]


def test_reference_gathers_keys_through_the_page_table():
    inp = _inputs(cases.IndexerCase("t", 2, 16, 4, 3, (7, 2), width_pages=5))
    keys, scales = naive.gathered_keys(inp["cache"], inp["page_table"])
    table = inp["page_table"].long().cpu()
    for b, n in enumerate(inp["seq_lens"].tolist()):
        for s in range(n):
            k, sc = inp["cache"].read(torch.tensor([int(table[b, s // 4]) * 4 + s % 4]))
            assert torch.equal(keys[b, s].cpu(), k[0].cpu()) and sc[0] == scales[b, s]


# ---- the kernels ---------------------------------------------------------------------------------

@interpreted
@pytest.mark.parametrize("mode", ["fused", "split"])
@pytest.mark.parametrize("case", cases.interpreter_cases(), ids=lambda c: c.name)
def test_kernels_keep_the_float64_top_k(case, mode):
    """Every awkward shape, both modes, outputs poisoned (integers too): the kept set is the float64
    top-k up to ties within rounding, and the same set the baseline slot keeps."""
    inp = _inputs(case)
    with nan_poisoned_allocations(ints=True):
        out = kernel.indexer_topk(*cases.args(inp), mode=mode)
    assert out.dtype == torch.int32 and out.shape == (case.batch, case.topk)
    assert not (out == POISONED).any()
    _ok(_judged(out, inp))
    base = baseline.indexer_topk_two_pass(*cases.args(inp), baseline.index_logits_fp8)
    assert [sorted(r) for r in out.tolist()] == [sorted(r) for r in base.tolist()]


@interpreted
@pytest.mark.parametrize("splits", [1, 2, 7])
def test_split_mode_deals_tiles_to_any_number_of_programs(splits):
    case = cases.IndexerCase("splits", 8, 32, 16, 16, (300, 17, 64, 0, 65))
    inp = _inputs(case, seed=3)
    _ok(_judged(kernel.indexer_topk(*cases.args(inp), mode="split", splits=splits), inp))


@interpreted
def test_scores_match_float64_and_nothing_past_a_request_is_written():
    case = cases.IndexerCase("scores", 20, 48, 16, 16, (70, 0, 3, 33), width_pages=9)
    inp = _inputs(case)
    scores = kernel.index_scores(inp["q8"], inp["weights"], inp["cache"], inp["seq_lens"], inp["page_table"])
    _, ref, abs_sum = naive.reference(*cases.args(inp))
    W = ref.shape[1]
    valid = torch.isfinite(ref)
    assert (((scores[:, :W].double().cpu() - ref).abs() / abs_sum)[valid] <= TIE).all()
    assert torch.isneginf(scores[:, :W][~valid.to(scores.device)]).all() and torch.isneginf(scores[:, W:]).all()


def test_torch_path_keeps_the_float64_top_k():
    """What a CPU runs without the interpreter: the same scores in torch, select_topk's selection."""
    for case in SMALL:
        inp = _inputs(case)
        _ok(_judged(kernel._indexer_topk_torch(*cases.args(inp)), inp))


def test_selection_order_is_topk_transforms():
    """Same scores in, same indices out, slot for slot: the radix select writes topk_transform's order."""
    case = cases.IndexerCase("order", 8, 32, 16, 16, (100, 16, 40), "near_ties")
    inp = _inputs(case)
    scores = kernel.index_scores(inp["q8"], inp["weights"], inp["cache"], inp["seq_lens"], inp["page_table"])
    ours = kernel.indexer_topk(*cases.args(inp), mode="split")
    assert torch.equal(ours, topk_transform(scores, inp["seq_lens"], inp["base"], case.topk))


@pytest.mark.parametrize("arch, shared_limit", [(90, 232448), (120, 101376)], ids=["sm90", "sm120"])
def test_the_kernels_compile_to_fp8_mma(arch, shared_limit):
    """Compiled ahead of time for an H100/H200 and an RTX PRO 6000 (no GPU needed), in a fresh
    interpreter without TRITON_INTERPRET, as a dsv4-flash launch specialises them (every pointer,
    stride and page size a multiple of 16): e4m3 tensor-core MMAs with fp32 accumulators, no
    spills, within the card's shared memory a block."""
    script = """ARCH = %d

import inspect, re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from dsv4opt.optimizations.indexer_topk import kernel as K
from dsv4opt.sass import ptxas_log
score = {"p_q": "*fp8e4nv", "p_w": "*fp32", "p_keys": "*fp8e4nv", "p_scales": "*fp32", "p_len": "*i32",
         "p_pages": "*i32", "p_rows": "*fp32", "stride_qb": "i32", "stride_qh": "i32", "stride_wb": "i32",
         "stride_pb": "i32", "stride_rb": "i32", "page_size": "i32", "page_bytes": "i32"}
flash = {"H": 64, "D": 128, "D_P": 128, "BLOCK_S": 64, "BLOCK_H": 64, "OPERAND": 2}
select = {"TOPK": 512, "K_P": 512, "BLOCK": 1024, "RADIX_BITS": 8}
kernels = {  # signature, constexprs, num_warps as kernel.indexer_topk launches them
    "_fused_kernel": (dict(score, p_base="*i32", p_out="*i32", stride_ob="i32"), {**flash, **select}, 8),
    "_score_split_kernel": (dict(score, splits="i32"), {**flash, "TOPK": 512}, 4),
    "_select_kernel": ({"p_rows": "*fp32", "p_len": "*i32", "p_base": "*i32", "p_out": "*i32", "stride_rb": "i32",
                        "stride_ob": "i32"}, select, 8),
}
for name, (sig, cx, warps) in kernels.items():
    fn = getattr(K, name)
    names = list(inspect.signature(fn.fn).parameters)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in sig if a not in ("splits",)}
    src = ASTSource(fn, dict(sig, **{k: "constexpr" for k in cx}), constexprs=cx, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", ARCH, 32), options={"num_warps": warps})
    ptx = c.asm["ptx"]
    spills = re.search(r"(\\d+) bytes spill stores", ptxas_log(ptx, ARCH))
    print(name, bool(re.search(r"mma\\S*\\.f32\\.e4m3\\.e4m3", ptx)), c.metadata.shared, spills.group(1) if spills else "?")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", script % arch], capture_output=True, text=True, env=env, timeout=600,
                          cwd=str(Path(__file__).resolve().parents[2]))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()}
    assert rows["_fused_kernel"][0] == "True" and rows["_score_split_kernel"][0] == "True", rows
    for name, (_, shared, spills) in rows.items():
        assert int(shared) <= shared_limit and spills == "0", (name, shared, spills)


# ---- the baseline slot, and the model calling the slot --------------------------------------------

def test_the_baseline_slot_is_indexer_logits_then_topk_transform():
    """The baseline makes the two calls the model made before the slot existed: the step's logits
    over the page table's width, then topk_transform on them (same launches, same parts)."""
    inp = _inputs(cases.IndexerCase("spy", 4, 16, 4, 3, (9, 2), width_pages=6))
    calls = []

    def logits(q8, weights, cache, seq_lens, page_table, max_len):
        calls.append(max_len)
        return kernel._scores_torch(q8, weights, cache, seq_lens, page_table)[:, :max_len]

    got = baseline.indexer_topk_two_pass(*cases.args(inp), logits)
    assert calls == [6 * 4]
    assert torch.equal(got, topk_transform(logits(*cases.args(inp)[:5], 24), inp["seq_lens"], inp["base"], 3))
    for path in (baseline.IMPLEMENTATIONS, baseline.hopper_0523()):
        assert path["indexer_topk"] is baseline.indexer_topk_two_pass


@interpreted
@pytest.mark.slow
@pytest.mark.parametrize("sglang", ["0.5.14", "0.5.23"])
def test_the_model_calls_the_slot_and_the_lever_keeps_its_step(sglang):
    """dsv4-tiny at the graph width: with indexer-topk the step sees the same entries (its scores
    equal the stand-in's under the interpreter), and the slot is called once a CSA layer."""
    from dsv4opt.workload.attention.flashmla import missing_on
    from dsv4opt.workload.config import CSA, ModelConfig
    from dsv4opt.workload.model import DecodeWorkload

    if sglang == "0.5.23" and missing_on(DEV):
        pytest.skip(missing_on(DEV))
    cfg = ModelConfig.from_name("dsv4-tiny")
    calls = []

    def counted(*a):
        calls.append(a[4].shape)
        return kernel.indexer_topk(*a)

    outs = []
    for impls in ({}, {"indexer_topk": counted}):
        wl = DecodeWorkload(cfg, concurrency=2, context=48, device=DEV, layers=3, seed=0, dtype=torch.float32,
                            impls=impls, graph_context=cfg.max_context, sglang=sglang)
        outs.append(wl.step(torch.tensor([1, 2], device=DEV)))
    csa = sum(cfg.layer_kind(i) == CSA for i in range(3))
    assert len(calls) == csa >= 1
    assert torch.equal(outs[0], outs[1])


# ---- the gate ------------------------------------------------------------------------------------

def test_judge_on_known_selections():
    scores = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]], dtype=torch.float64)
    abs_sum = torch.ones_like(scores)
    lens, base = torch.tensor([6]), torch.tensor([100])

    def judged(row, tie=1e-3, n=None):
        return check_module.judge(torch.tensor([row]), lens if n is None else torch.tensor([n]), base, 3, scores,
                                  abs_sum, tie)

    right = judged([102, 100, 101])
    assert not right["malformed"][0] and right["gap"][0] == 0 and right["recall"][0] == 1
    far = judged([100, 101, 105])  # entry 5 (score 0) kept over entry 2 (score 3)
    assert far["gap"][0] > 0 and far["recall"][0] == pytest.approx(2 / 3)
    assert judged([100, 101, 103], tie=0.6)["gap"][0] == 0  # 3 against 2: a tie within 2 * 0.6
    for bad in ([100, 100, 101], [100, 101, -1], [100, 101, 106], [-1, 100, 101], [99, 100, 101]):
        assert judged(bad)["malformed"][0], bad
    assert not judged([101, 100, -1], n=2)["malformed"][0]  # a short request: all of it, any order
    assert judged([100, -1, -1], n=2)["malformed"][0]


def _off_by_one_page(q8, weights, cache, seq_lens, page_table, base, topk, logits=None):
    """Each entry read from the next page of the request's table (an index slip in the kernel)."""
    return kernel.indexer_topk(q8, weights, cache, seq_lens, F.pad(page_table[:, 1:], (0, 1)), base, topk)


def _scale_dropped(q8, weights, cache, seq_lens, page_table, base, topk, logits=None):
    """The keys' fp32 scales left out of the scores."""
    scores = kernel._scores_torch(q8, weights, cache, seq_lens, page_table)
    keys, scales = naive.gathered_keys(cache, page_table)
    return select_topk((scores / scales.float()).nan_to_num(neginf=float("-inf")), seq_lens, base, topk)


def _one_head_lost(q8, weights, cache, seq_lens, page_table, base, topk, logits=None):
    """The last head's weight lost (a head loop one short)."""
    w = weights.clone()
    w[:, -1] = 0
    return kernel.indexer_topk(q8, w, cache, seq_lens, page_table, base, topk)


def _unwritten(q8, weights, cache, seq_lens, page_table, base, topk, logits=None):
    return torch.empty(q8.shape[0], topk, dtype=torch.int32, device=q8.device)


def _base_ignored(q8, weights, cache, seq_lens, page_table, base, topk, logits=None):
    return kernel.indexer_topk(q8, weights, cache, seq_lens, page_table, torch.zeros_like(base), topk)


@interpreted
@pytest.mark.parametrize("broken", [_off_by_one_page, _scale_dropped, _one_head_lost, _unwritten, _base_ignored],
                         ids=lambda f: f.__name__.strip("_"))
def test_the_gate_fails_a_broken_implementation(broken):
    r = check_module.check("cpu", cases=SMALL, impl=broken, model=False)
    assert not r.passed and "FAILED" in r.summary, r.summary
    assert r.figures["unexplained"] + r.figures["malformed"] > 0, r.figures


@interpreted
@pytest.mark.slow
def test_the_gate_passes_the_kernels_with_the_model_part():
    r = check_module.check("cpu")
    assert r.passed, r.summary
    assert r.figures["model_ranked"] > 0 and r.figures["model_unexplained"] == 0
    assert r.figures["score_err"] < TIE / 10  # fp32 summation order only: far inside the bound
    assert {c["case"] for c in r.details["cases"]} == {c.name for c in cases.interpreter_cases()}
    assert all(c["baseline_unexplained"] == 0 and c["baseline_malformed"] == 0 for c in r.details["cases"])


# ---- registry, recommend, torch-compile ----------------------------------------------------------

def test_registry_entry():
    opt = get("indexer-topk")
    assert implementations(["indexer-topk"]) == {"indexer_topk": kernel.indexer_topk}
    assert opt.parts == ("indexer",) and opt.changes_selection and opt.needs_measurement
    assert opt.bench_module == "dsv4opt.optimizations.indexer_topk.bench"
    both = implementations(["bf16-gemm", "indexer-topk"])
    assert set(both) == {"indexer_logits", "hc_premix", "indexer_topk"}


def test_no_speed_up_is_on_record():
    """Nothing measured on a GPU yet: no measured.json, so recommend never ranks it (below)."""
    from importlib import resources

    from dsv4opt.decision.recommend import measured_kernel_speedup

    assert not resources.files("dsv4opt.optimizations.indexer_topk").joinpath("measured.json").is_file()
    assert measured_kernel_speedup(get("indexer-topk"), 64, "0.5.23 sm_90")[0] is None


@pytest.mark.parametrize("profile", ["hopper-0.5.23/embedded-dsv4-flash-c64-baseline-20261204-034003.json",
                                     "layouts/campaign/embedded-dsv4-flash-c32-baseline-20261204-112517.json"])
def test_recommend_says_it_is_unmeasured_and_never_chooses_it(profile):
    from dsv4opt.analysis.profile import Profile
    from dsv4opt.decision.recommend import recommend
    from tests.helpers import REPO

    rec = recommend(Profile.load(REPO / "evidence/h200/profiles" / profile))
    cand = {c.name: c for c in rec.candidates}["indexer-topk"]
    assert cand.fits is None and cand.share_of == "parts indexer" and cand.share > 0.1
    assert rec.chosen is None or rec.chosen.name != "indexer-topk"
    line = next(x for x in rec.explanation if x.startswith("indexer-topk"))
    assert "no speed-up of it is measured" in line and line.endswith("not recommended")


def test_torch_compile_makes_the_slot_an_opaque_op():
    from dsv4opt.optimizations.torch_compile import ops

    ops.install_slots({"indexer_topk": kernel.indexer_topk})
    inp = _inputs(cases.IndexerCase("op", 4, 16, 4, 3, (9, 2, 0)))
    key = next(k for k, fn in ops._SLOT_IMPLS.items() if fn is kernel.indexer_topk)
    got = ops.SLOT_STAND_INS["indexer_topk"](key)(*cases.args(inp), None)
    assert torch.equal(got, kernel.indexer_topk(*cases.args(inp)))
    assert baseline.indexer_topk_two_pass in ops.TRACED_SLOTS


@pytest.mark.slow
def test_compiled_blocks_take_the_slot_as_one_opaque_op(torch_path):
    """torch-compile beside indexer-topk: the CSA block compiles whole (no graph break) with the slot
    as dsv4opt.indexer_topk_slot, and matches its eager twin."""
    from dsv4opt.optimizations.torch_compile.check import GateSettings, run_check
    from dsv4opt.optimizations.torch_compile.regions import CompiledRegions

    seen: set[str] = set()

    def recording(gm, example_inputs):
        seen.update(str(n.target).removesuffix(".default") for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    settings = GateSettings(config="dsv4-tiny", concurrency=2, context=40, steps=1, layers=3, bf16_report=False)
    impls = {**implementations(["indexer-topk"]), "regions": CompiledRegions(recording)}
    r = run_check(torch.device("cpu"), impls, settings)
    assert r.passed and r.figures["graph_breaks"] == 0, r.summary
    assert "dsv4opt.indexer_topk_slot" in seen and "dsv4opt.topk_transform" not in seen, seen


# ---- the bench -----------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is a CPU's")
def test_the_bench_refuses_on_a_cpu_in_one_line():
    with pytest.raises(DsvOptError) as err:
        bench.run_bench()
    assert "needs a CUDA GPU" in str(err.value) and "\n" not in str(err.value)
    from typer.testing import CliRunner

    from dsv4opt.cli import app

    result = CliRunner().invoke(app, ["bench", "indexer-topk"], env={"COLUMNS": "400"})
    assert result.exit_code == 1 and "needs a CUDA GPU" in result.output and "Traceback" not in result.output


def test_bench_bytes_are_plain_sums():
    cfg = bench.CFG
    lengths, width = [2048, 100, 0], 4096 * 64
    got = bench.bytes_moved(cfg, lengths, width)
    keys = (2048 + 100) * 132
    assert got["floor"] == 3 * 64 * 132 + keys + 3 * 512 * 4
    assert got["sglang_rows"] == (2048 + 2048) * 4 + (256 + 100) * 4
    assert got["claimed_rows"] == 2 * 3 * width * 4
    # 21 CSA layers at C = 64 and 2048 entries: the floor's 2.82 GB against 22 MB written and read
    assert 21 * bench.bytes_moved(cfg, [2048] * 64, width)["claimed_rows"] == 2_818_572_288
    assert 21 * bench.bytes_moved(cfg, [2048] * 64, width)["sglang_rows"] == 22_020_096
    assert bench.graph_width_pages() == 4096


def test_bench_input_sets_on_a_cpu():
    s = bench.input_set(2, 100, 8, torch.Generator().manual_seed(0), device="cpu")
    assert s["page_table"].tolist()[0] == [1, 2, 0, 0, 0, 0, 0, 0] and s["page_table"].tolist()[1][:3] == [3, 4, 0]
    assert s["base"].tolist() == [0, 128] and s["seq_lens"].tolist() == [100, 100]
    out = kernel._indexer_topk_torch(*bench._args(s))
    assert out.shape == (2, 512) and (out[:, 100:] == -1).all()
