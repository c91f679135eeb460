"""bf16-gemm: kernels against the float32/float64 references, and a gate that can fail.

The Triton kernels run under the interpreter in float16 (it cannot multiply bf16); the bf16 path
on the CPU is the torch emulation, tested against float64 on the same rounded inputs.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
import torch

import dsv4opt.optimizations.bf16_gemm as bf16_gemm
from dsv4opt.numerics import error_report
from dsv4opt.optimizations.bf16_gemm import kernel, naive
from dsv4opt.optimizations.bf16_gemm.check import ModelSettings, run_check, selection_figures
from dsv4opt.optimizations.registry import get, implementations
from dsv4opt.workload.kernels import naive as workload_naive
from dsv4opt.workload.kernels import indexer_tc

# The package exports the function `check`, which hides the submodule of the same name.
check_module = importlib.import_module("dsv4opt.optimizations.bf16_gemm.check")
interpreted = pytest.mark.skipif(not kernel._INTERPRETED, reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")
on_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Contexts 48..80 tokens: 12..20 compressed entries per request at ratio 4, above dsv4-tiny's top-6.
SMALL_MODEL = ModelSettings(config="dsv4-tiny", concurrency=4, context=64, steps=2, layers=None)
CPU = torch.device("cpu")


def _indexer_inputs(B, H, D, S, seed=0):
    """The slot's arguments: e4m3 queries and keys (one scale each) in a paged cache; lengths vary."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, D, generator=gen)
    keys = torch.randn(B, max(S, 1), D, generator=gen)[:, :S] * 3
    w = torch.randn(B, H, generator=gen)
    lengths = torch.linspace(S, 0, B).round().long() if B > 1 else torch.tensor([S])
    return check_module._slot_inputs(q, keys, w, lengths)


def _reference(inp):
    keys, scales = inp["cache"].read(torch.arange(inp["cache"].data.shape[0] * inp["cache"].page_size))
    B = inp["q8"].shape[0]
    pages = inp["page_table"].shape[1]
    keys = keys.view(B, pages * inp["cache"].page_size, inp["q8"].shape[2])[:, : inp["max_len"]]
    scales = scales.view(B, -1)[:, : inp["max_len"]]
    return workload_naive.index_logits(inp["q8"], inp["weights"], keys, scales, inp["seq_lens"])


INDEXER_SHAPES = [  # (B, Hi, Di, S)
    pytest.param(1, 4, 16, 5, id="batch1-fewer-entries-than-tile"),
    pytest.param(2, 20, 48, 70, id="heads-not-pow2-entries-not-page"),
    pytest.param(3, 64, 128, 130, id="flash-heads-entries-not-tile"),
    pytest.param(2, 8, 32, 0, id="no-entries"),
]


@interpreted
@pytest.mark.parametrize("B,H,D,S", INDEXER_SHAPES)
def test_indexer_kernel_matches_float64(B, H, D, S):
    inp = _indexer_inputs(B, H, D, S)
    out = kernel.indexer_logits(*check_module._to(inp, torch.device("cpu")))
    err = error_report(out, _reference(inp))
    assert err.ok(1e-5), err


@interpreted
def test_indexer_kernel_at_graph_width_writes_minus_inf_past_each_request():
    """SGLang's page table is as wide as the model's context: pages past a request's own are page 0
    and its logits there -inf (the kernel skips those blocks without reading them)."""
    inp = _indexer_inputs(3, 8, 32, 70)
    narrow = _reference(inp)
    table = inp["page_table"]
    wide = dict(inp, page_table=torch.cat([table, torch.zeros(table.shape[0], 40, dtype=table.dtype)], 1))
    wide["max_len"] = wide["page_table"].shape[1] * inp["cache"].page_size
    out = kernel.indexer_logits(*check_module._to(wide, torch.device("cpu")))
    assert out.shape == (3, wide["max_len"])
    err = error_report(out[:, : narrow.shape[1]], narrow)
    assert err.ok(1e-5), err
    assert torch.isneginf(out[:, narrow.shape[1] :]).all()


@pytest.mark.parametrize("B,H,D,S", INDEXER_SHAPES)
def test_indexer_emulation_and_baseline_match_float64(B, H, D, S):
    """e4m3 products are exact in fp32, so only fp32 summation error remains, on either path."""
    inp = _indexer_inputs(B, H, D, S)
    args = check_module._to(inp, torch.device("cpu"))
    for out in (indexer_tc._indexer_logits_emulated(*args), naive.indexer_logits_fp32(*args)):
        err = error_report(out, _reference(inp))
        assert err.ok(1e-5), err


PREMIX_SHAPES = [  # (T, N, K)
    pytest.param(1, 24, 256, id="one-token"),
    pytest.param(5, 24, 1000, id="k-not-tile"),
    pytest.param(33, 24, 384, id="tokens-not-tile"),
    pytest.param(70, 3, 200, id="more-tokens-than-tile-few-outputs"),
]


@interpreted
@pytest.mark.parametrize("T,N,K", PREMIX_SHAPES)
def test_premix_kernel_matches_float64_on_rounded_inputs(T, N, K):
    x, weight = torch.randn(T, K), torch.randn(N, K)
    out = kernel.hc_premix_lowp(x, weight, torch.float16)
    ref = naive.hc_premix_ref(x.half(), weight.half(), torch.float64)
    err = error_report(out, ref)
    assert err.ok(1e-5), err


@pytest.mark.parametrize("T,N,K", PREMIX_SHAPES)
def test_premix_bf16_path_matches_float64_on_rounded_inputs(T, N, K):
    x, weight = torch.randn(T, K), torch.randn(N, K)
    out = bf16_gemm.hc_premix(x, weight)
    ref = naive.hc_premix_ref(x.bfloat16(), weight.bfloat16(), torch.float64)
    err = error_report(out, ref)
    assert err.ok(1e-5), err
    # and against the unrounded float32 path: bf16 input rounding, 2^-9 per element, averages down
    assert error_report(out, naive.hc_premix_ref(x, weight, torch.float64)).ok(4e-3)


INDEXER_SIGNATURE = {
    "p_q": "*fp8e4nv", "p_w": "*fp32", "p_keys": "*fp8e4nv", "p_scales": "*fp32", "p_len": "*i32",
    "p_pages": "*i32", "p_out": "*fp32", "stride_qb": "i32", "stride_qh": "i32", "stride_wb": "i32",
    "stride_pb": "i32", "stride_ob": "i32", "page_size": "i32", "page_bytes": "i32", "max_len": "i32",
}
PREMIX_SIGNATURE = {
    "p_x": "*fp32", "p_w": "*bf16", "p_part": "*fp32", "T": "i32", "N": "i32", "K": "i32",
    "s_xt": "i32", "s_wn": "i32", "s_ps": "i32", "s_pt": "i32",
}


INDEXER = "dsv4opt.workload.kernels.indexer_tc"
PREMIX = "dsv4opt.optimizations.bf16_gemm.kernel"
BF16_MMA = r"mma\S*\.f32\.bf16\.bf16"
FP8_MMA = r"mma\S*\.f32\.e4m3\.e4m3"
INDEXER_FLASH = {"H": 64, "D": 128, "D_P": 128, "BLOCK_S": 64, "BLOCK_H": 64}


@pytest.mark.parametrize("module,name,signature,constexprs,mma", [
    pytest.param(INDEXER, "_indexer_logits_kernel", INDEXER_SIGNATURE, {**INDEXER_FLASH, "OPERAND": 1}, BF16_MMA,
                 id="indexer-flash-bf16"),
    # the Hopper path's stand-in for DeepGEMM's fp8_paged_mqa_logits: FP8 operands kept
    pytest.param(INDEXER, "_indexer_logits_kernel", INDEXER_SIGNATURE, {**INDEXER_FLASH, "OPERAND": 2}, FP8_MMA,
                 id="indexer-flash-fp8"),
    pytest.param(PREMIX, "_premix_mm_kernel", PREMIX_SIGNATURE,
                 {"K_PER_SPLIT": 128, "BLOCK_T": 64, "BLOCK_N": 32, "BLOCK_K": 128}, BF16_MMA, id="premix-64-tokens"),
    pytest.param(PREMIX, "_premix_mm_kernel", PREMIX_SIGNATURE,
                 {"K_PER_SPLIT": 128, "BLOCK_T": 16, "BLOCK_N": 32, "BLOCK_K": 128}, BF16_MMA, id="premix-1-token"),
])
def test_kernels_compile_to_tensor_core_mma_on_sm90(module, name, signature, constexprs, mma):
    """Compiled ahead of time for an H200 (no GPU needed): bf16 (or e4m3) MMAs with fp32 accumulators.

    In a fresh interpreter without TRITON_INTERPRET: once the interpreter has run a kernel in this
    process, triton.language is patched and a real compile would fail for reasons of its own.
    """
    import json
    import subprocess
    import sys

    script = f"""
import re, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import importlib
sig = dict({signature!r}, **{{k: "constexpr" for k in {constexprs!r}}})
fn = getattr(importlib.import_module({module!r}), {name!r})
ptx = triton.compile(ASTSource(fn, sig, constexprs={constexprs!r}), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
print(bool(re.search({mma!r}, ptx)))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                          cwd=str(Path(__file__).resolve().parents[2]))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().lower()), f"no tensor-core MMA matching {mma} with fp32 accumulation"


def test_references_are_the_workload_baseline():
    """naive.py is this package's definition of correct: the workload's float32 path, not a copy."""
    from dsv4opt.workload import baseline

    assert naive.indexer_logits_fp32 is baseline.IMPLEMENTATIONS["indexer_logits"]
    x, weight = torch.randn(7, 512), torch.randn(24, 512)
    assert error_report(naive.hc_premix_ref(x, weight), baseline.hc_premix_fp32(x, weight)).ok(1e-6)


def test_registry_resolves_both_slots_to_this_package():
    impls = implementations(["bf16-gemm"])
    assert impls["indexer_logits"] is bf16_gemm.indexer_logits
    assert impls["hc_premix"] is bf16_gemm.hc_premix


def test_cached_cast_converts_once_and_notices_in_place_updates():
    weight = torch.randn(24, 64)
    first = kernel.cached_cast(weight, torch.bfloat16)
    assert kernel.cached_cast(weight, torch.bfloat16) is first
    weight.mul_(2.0)
    second = kernel.cached_cast(weight, torch.bfloat16)
    assert second is not first
    assert torch.equal(second, weight.bfloat16())
    already = weight.bfloat16()
    assert kernel.cached_cast(already, torch.bfloat16) is already


def test_topk_select_pads_short_requests():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7], [3.0, 1.0, 2.0, 9.0]])
    sel = naive.topk_select(scores, torch.tensor([4, 2]), 3)
    assert sorted(sel[0].tolist()) == [1, 2, 3]
    assert sel[1].tolist() == [0, 1, -1]  # entry 3 lies beyond the request's length


def test_selection_figures_on_a_known_swap():
    ref = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    new = torch.tensor([[4.0, 3.0, 0.5, 1.0, 0.0]])  # entry 2 drops below entry 3
    figs = selection_figures(ref, new, torch.tensor([5]), 3)
    assert figs["recall"].item() == pytest.approx(2 / 3)
    e = torch.tensor([4.0, 3.0, 2.0]).exp()
    assert figs["lost_mass"].item() == pytest.approx(float(e[2] / e.sum()))
    assert figs["swap_gap"].item() == pytest.approx(1.0 / float(ref.std()))


def _scores_ignored(q8, weights, cache, seq_lens, page_table, max_len):
    """A broken indexer: random scores, so top-k keeps about k/S of the right entries."""
    logits = naive.indexer_logits_fp32(q8, weights, cache, seq_lens, page_table, max_len)
    noise = torch.rand(logits.shape, generator=torch.Generator().manual_seed(7)).to(logits.device)
    return torch.where(torch.isfinite(logits), noise, logits)


def _lowest_first(q8, weights, cache, seq_lens, page_table, max_len):
    """A broken indexer: scores negated (a sign slip), so top-k picks the lowest-scored entries."""
    logits = naive.indexer_logits_fp32(q8, weights, cache, seq_lens, page_table, max_len)
    return torch.where(torch.isfinite(logits), -logits, logits)


def _scales_as_powers_of_two(q8, weights, cache, seq_lens, page_table, max_len):
    """A plausible mistake: each key's fp32 scale read as a power of two (the attention cache's
    UE8M0 format), which moves scores by up to 2x."""
    logits = naive.indexer_logits_fp32(q8, weights, cache, seq_lens, page_table, max_len)
    s = torch.arange(max_len)
    entries = page_table.long()[:, s // cache.page_size] * cache.page_size + s % cache.page_size
    _, scales = cache.read(entries.reshape(-1), torch.float32)
    scales = scales.view(logits.shape)
    return logits / scales * torch.exp2(torch.ceil(torch.log2(scales)))


def _premix_negated(x, weight):
    """A broken pre-mix: the sign of the product flipped."""
    return -bf16_gemm.hc_premix(x, weight)


def _premix_transposed(x, weight):
    """A broken pre-mix: the [N, K] weight read column-major (a stride slip in the kernel)."""
    N, K = weight.shape
    return bf16_gemm.hc_premix(x, weight.reshape(K, N).t())


def _premix_last_tile_dropped(x, weight):
    """A broken pre-mix: the last 128-wide K tile of the split-K sum left out."""
    K = weight.shape[1]
    return bf16_gemm.hc_premix(x[:, : K - 128], weight[:, : K - 128])


def _premix_fp8_weight(x, weight):
    """A subtler mistake: the pre-mix weight stored in fp8 e4m3 without a scale."""
    return naive.hc_premix_ref(x, weight.to(torch.float8_e4m3fn).float())


def _separation(good: float, bound: float, broken: float) -> str:
    """The margins on both sides of a bound, for assertion messages."""
    below = f"{bound / good:.3g}x" if good > 0 else "inf"
    return f"correct {good:.3g}, bound {bound:.3g} ({below} above it), broken {broken:.3g} ({broken / bound:.3g}x the bound)"


@pytest.fixture(scope="module")
def correct_model_figures():
    """The real implementations' model-level figures, measured once for the tests below."""
    with pytest.MonkeyPatch.context() as mp:
        if not torch.cuda.is_available():
            mp.setenv("TRITON_INTERPRET", "0")  # what the torch_path fixture does, at module scope
        return check_module.model_figures(SMALL_MODEL, CPU, dict(bf16_gemm.IMPLEMENTATIONS))[0]


def test_premix_rounding_bound_is_twice_the_rms_bf16_can_give():
    """2 sqrt(1 + hc) u with u = 2^-8 (docs/optimizations/bf16_gemm.md derives it)."""
    assert check_module.premix_rounding_bound(4) == pytest.approx(2 * 5**0.5 / 256)


def test_premix_error_vs_terms_on_known_errors():
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    weight = torch.tensor([[2.0, 1.0]])  # products 2, 2 and 6, -1: squared terms sum to 4+4+36+1 = 45
    exact = torch.tensor([[4.0], [5.0]])
    assert check_module.premix_error_vs_terms(exact, x, weight) == 0.0
    off = exact + torch.tensor([[3.0], [-6.0]])
    assert check_module.premix_error_vs_terms(off, x, weight) == pytest.approx((9 + 36) ** 0.5 / 45**0.5)


@pytest.mark.parametrize("broken", [_lowest_first, _scores_ignored, _scales_as_powers_of_two],
                         ids=["lowest-first", "scores-ignored", "scales-as-powers-of-two"])
def test_model_level_part_separates_a_broken_indexer_from_the_real_one(torch_path, correct_model_figures, broken):
    """In the model, on the same arguments as the float32 path: the real indexer selects what it
    selects, a broken one loses recall on every ranked request, whatever the torch version (nothing
    compounds: the model itself runs the float32 path)."""
    bad, counts = check_module.model_figures(SMALL_MODEL, CPU, dict(bf16_gemm.IMPLEMENTATIONS, indexer_logits=broken))
    assert counts["ranked_requests"] >= 16, counts
    key = "model_recall_loss_mean"
    bound, good = check_module.BOUNDS[key], correct_model_figures[key]
    margin = _separation(good, bound, bad[key])
    assert bound >= 5 * good and bad[key] >= 5 * bound, margin
    # the pre-mix figure does not move with the indexer: each slot is judged on its own calls
    assert bad["model_premix_err_worst"] == correct_model_figures["model_premix_err_worst"]


@pytest.mark.parametrize("broken", [_premix_negated, _premix_transposed, _premix_last_tile_dropped],
                         ids=["negated", "weight-transposed", "last-k-tile-dropped"])
def test_model_level_part_separates_a_broken_premix_from_the_real_one(torch_path, correct_model_figures, broken):
    bad, _ = check_module.model_figures(SMALL_MODEL, CPU, dict(bf16_gemm.IMPLEMENTATIONS, hc_premix=broken))
    key = "model_premix_err_worst"
    bound, good = check_module.premix_rounding_bound(4), correct_model_figures[key]
    margin = _separation(good, bound, bad[key])
    assert bound >= 5 * good and bad[key] >= 5 * bound, margin
    assert bad["model_recall_loss_mean"] == correct_model_figures["model_recall_loss_mean"]


def test_model_level_part_fails_outputs_left_unwritten(torch_path):
    """The candidate runs with NaN-poisoned allocations: an output it never writes cannot pass."""
    def indexer_unwritten(q8, weights, cache, seq_lens, page_table, max_len):
        return torch.empty(q8.shape[0], max_len)

    def premix_unwritten(x, weight):
        return torch.empty(x.shape[0], weight.shape[0])

    impls = {"indexer_logits": indexer_unwritten, "hc_premix": premix_unwritten}
    figures, _ = check_module.model_figures(SMALL_MODEL, CPU, impls)
    assert figures == {"model_recall_loss_mean": 1.0, "model_premix_err_worst": float("inf")}


@pytest.fixture(scope="module")
def correct_cuda_model_figures():
    dev = torch.device("cuda")
    return check_module.model_figures(check_module._model_settings(dev), dev, dict(bf16_gemm.IMPLEMENTATIONS))[0]


@on_cuda
@pytest.mark.parametrize("slot,broken", [
    pytest.param("indexer_logits", _lowest_first, id="indexer-lowest-first"),
    pytest.param("indexer_logits", _scores_ignored, id="indexer-scores-ignored"),
    pytest.param("hc_premix", _premix_negated, id="premix-negated"),
    pytest.param("hc_premix", _premix_transposed, id="premix-weight-transposed"),
])
def test_model_level_part_separates_broken_implementations_on_cuda(correct_cuda_model_figures, slot, broken):
    """The gate's own GPU run (dsv4-flash, 6 layers, bf16 activations, the Triton kernels)."""
    dev = torch.device("cuda")
    bad, _ = check_module.model_figures(check_module._model_settings(dev), dev,
                                        dict(bf16_gemm.IMPLEMENTATIONS, **{slot: broken}))
    key = "model_recall_loss_mean" if slot == "indexer_logits" else "model_premix_err_worst"
    bound = check_module.BOUNDS[key] if key in check_module.BOUNDS else check_module.premix_rounding_bound(4)
    good = correct_cuda_model_figures[key]
    margin = _separation(good, bound, bad[key])
    assert bound >= 5 * good and bad[key] >= 5 * bound, margin


@on_cuda
def test_registered_check_passes_on_cuda():
    result = get("bf16-gemm").check("cuda")
    assert result.passed, result.summary


def test_correct_premix_in_the_model_scores_what_bf16_rounding_predicts(correct_model_figures):
    """fp32 activations on the CPU: x and w both rounded, rms relative error 0.42 u each, so about
    0.6 u = 2.3e-3 (docs); far from both 0 (no rounding at all) and the bound."""
    assert 1.5e-3 < correct_model_figures["model_premix_err_worst"] < 4e-3, correct_model_figures


def test_check_passes_with_the_real_implementations(torch_path):
    result = run_check(CPU, dict(bf16_gemm.IMPLEMENTATIONS), model=SMALL_MODEL)
    assert result.passed, result.summary
    assert set(result.bounds) <= set(result.figures)
    assert "passed" in result.summary and "model_premix_err_worst" in result.bounds


def test_check_fails_closed_on_a_bad_indexer(torch_path):
    impls = dict(bf16_gemm.IMPLEMENTATIONS, indexer_logits=_scales_as_powers_of_two)
    result = run_check(CPU, impls, model=SMALL_MODEL)
    assert not result.passed
    assert result.figures["recall_loss_mean"] > result.bounds["recall_loss_mean"]
    assert result.summary.count("FAILED") == 1 and "recall_loss_mean" in result.summary


def test_registered_check_fails_closed_on_a_subtly_bad_premix(torch_path, monkeypatch):
    """Through the registry. An unscaled fp8 weight (rms error 0.42 x 2^-4) fails the scenario
    figures by 5x and the model-level figure too, though by less (1.5x): the two parts together."""
    monkeypatch.setattr(bf16_gemm, "IMPLEMENTATIONS", dict(bf16_gemm.IMPLEMENTATIONS, hc_premix=_premix_fp8_weight))
    monkeypatch.setattr(check_module, "_model_settings", lambda device: SMALL_MODEL)
    result = get("bf16-gemm").check("cpu")
    assert not result.passed
    for name in ("premix_rel_pre", "premix_rel_post", "premix_rel_comb", "model_premix_err_worst"):
        assert result.figures[name] > result.bounds[name], (name, result.summary)


def test_check_fails_closed_without_the_model(torch_path, monkeypatch):
    def missing(settings, device, impls):
        raise ImportError("no module named dsv4opt.workload.model")

    monkeypatch.setattr(check_module, "model_figures", missing)
    result = run_check(CPU, dict(bf16_gemm.IMPLEMENTATIONS), batch=2, model=SMALL_MODEL)
    assert not result.passed
    assert "model-level part not measured" in result.summary


def test_check_fails_closed_when_no_request_ranks_more_than_top_k(torch_path):
    """Contexts of 8..12 tokens hold at most 3 entries, below top-6: any indexer would pass."""
    short = ModelSettings(config="dsv4-tiny", concurrency=2, context=10, steps=1, layers=None)
    result = run_check(CPU, dict(bf16_gemm.IMPLEMENTATIONS), batch=2, model=short)
    assert not result.passed
    assert "model-level part not measured" in result.summary and "top-6" in result.summary


def _best_entry_of_request_0_last_on_long_contexts(q8, weights, cache, seq_lens, page_table, max_len):
    """The real indexer, except that past 1,024 entries request 0's best-scored entry scores lowest:
    recall drops by one entry of 512 (within its bounds), the mass that entry held is lost."""
    logits = bf16_gemm.IMPLEMENTATIONS["indexer_logits"](q8, weights, cache, seq_lens, page_table, max_len).clone()
    if logits.shape[1] > 1024:
        n = int(seq_lens[0])
        row = logits[0, :n]
        row[row.argmax()] = row.min() - 1.0
    return logits


def test_check_fails_on_lost_mass_alone(torch_path):
    """A broken indexer that crosses the lost-mass bound and no other: the gate still fails it
    (mutation audit #17: with that bound out of reach the gate passed it)."""
    impls = dict(bf16_gemm.IMPLEMENTATIONS, indexer_logits=_best_entry_of_request_0_last_on_long_contexts)
    result = run_check(CPU, impls, model=SMALL_MODEL)
    assert not result.passed
    crossed = [k for k, bound in result.bounds.items() if result.figures[k] > bound]
    assert crossed == ["lost_mass_worst"], crossed
