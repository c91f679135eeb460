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
from dsv4opt.optimizations.bf16_gemm.check import E2ESettings, run_check, selection_figures
from dsv4opt.optimizations.registry import get, implementations
from dsv4opt.workload.kernels import naive as workload_naive

# The package exports the function `check`, which hides the submodule of the same name.
check_module = importlib.import_module("dsv4opt.optimizations.bf16_gemm.check")
interpreted = pytest.mark.skipif(not kernel._INTERPRETED, reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")

SMALL_E2E = E2ESettings(config="dsv4-tiny", concurrency=4, context=64, steps=4, layers=None)


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


@pytest.mark.parametrize("B,H,D,S", INDEXER_SHAPES)
def test_indexer_emulation_and_baseline_match_float64(B, H, D, S):
    """e4m3 products are exact in fp32, so only fp32 summation error remains, on either path."""
    inp = _indexer_inputs(B, H, D, S)
    args = check_module._to(inp, torch.device("cpu"))
    for out in (kernel._indexer_logits_emulated(*args), naive.indexer_logits_fp32(*args)):
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


@pytest.mark.parametrize("name,signature,constexprs", [
    pytest.param("_indexer_logits_kernel", INDEXER_SIGNATURE,
                 {"H": 64, "D": 128, "D_P": 128, "BLOCK_S": 64, "BLOCK_H": 64, "DOT_FP16": False}, id="indexer-flash"),
    pytest.param("_premix_mm_kernel", PREMIX_SIGNATURE,
                 {"K_PER_SPLIT": 128, "BLOCK_T": 64, "BLOCK_N": 32, "BLOCK_K": 128}, id="premix-64-tokens"),
    pytest.param("_premix_mm_kernel", PREMIX_SIGNATURE,
                 {"K_PER_SPLIT": 128, "BLOCK_T": 16, "BLOCK_N": 32, "BLOCK_K": 128}, id="premix-1-token"),
])
def test_kernels_compile_to_bf16_tensor_core_mma_on_sm90(name, signature, constexprs):
    """Compiled ahead of time for an H200 (no GPU needed): bf16 MMAs with fp32 accumulators.

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
from dsv4opt.optimizations.bf16_gemm import kernel
sig = dict({signature!r}, **{{k: "constexpr" for k in {constexprs!r}}})
fn = getattr(kernel, {name!r})
ptx = triton.compile(ASTSource(fn, sig, constexprs={constexprs!r}), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
print(bool(re.search(r"mma\\S*\\.f32\\.bf16\\.bf16", ptx)))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                          cwd=str(Path(__file__).resolve().parents[2]))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().lower()), "no bf16 tensor-core MMA with fp32 accumulation"


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


def _bad_indexer(q8, weights, cache, seq_lens, page_table, max_len):
    """A plausible mistake: each key's fp32 scale read as a power of two (the attention cache's
    UE8M0 format), which moves scores by up to 2x."""
    logits = naive.indexer_logits_fp32(q8, weights, cache, seq_lens, page_table, max_len)
    s = torch.arange(max_len)
    entries = page_table.long()[:, s // cache.page_size] * cache.page_size + s % cache.page_size
    _, scales = cache.read(entries.reshape(-1), torch.float32)
    scales = scales.view(logits.shape)
    return logits / scales * torch.exp2(torch.ceil(torch.log2(scales)))


def _bad_premix(x, weight):
    """A plausible mistake: the pre-mix weight stored in fp8 e4m3 without a scale."""
    return naive.hc_premix_ref(x, weight.to(torch.float8_e4m3fn).float())


def test_check_passes_with_the_real_implementations(torch_path):
    result = run_check(torch.device("cpu"), dict(bf16_gemm.IMPLEMENTATIONS), e2e=SMALL_E2E)
    assert result.passed, result.summary
    assert set(result.bounds) <= set(result.figures)


def test_check_fails_closed_on_a_bad_indexer(torch_path):
    impls = dict(bf16_gemm.IMPLEMENTATIONS, indexer_logits=_bad_indexer)
    result = run_check(torch.device("cpu"), impls, e2e=SMALL_E2E)
    assert not result.passed
    assert result.figures["recall_loss_mean"] > result.bounds["recall_loss_mean"]
    assert "FAILED" in result.summary and "recall_loss_mean" in result.summary


def test_registered_check_fails_closed_on_a_bad_premix(torch_path, monkeypatch):
    """Through the registry, so the model-level part runs the bad pre-mix inside the model too."""
    monkeypatch.setattr(bf16_gemm, "IMPLEMENTATIONS", dict(bf16_gemm.IMPLEMENTATIONS, hc_premix=_bad_premix))
    monkeypatch.setattr(check_module, "_e2e_settings", lambda device: SMALL_E2E)
    result = get("bf16-gemm").check("cpu")
    assert not result.passed
    for name in ("premix_rel_pre", "premix_rel_post", "premix_rel_comb"):
        assert result.figures[name] > result.bounds[name], (name, result.summary)


def test_model_level_part_separates_a_broken_indexer_from_the_real_one(torch_path):
    """Block by block in the model, an indexer that picks the lowest-scored entries fails by a wide
    margin while the real one stays at summation-order noise (the figure the previous end-to-end
    gate lacked: whole-step hidden states on chaotic random-weight dynamics)."""
    def lowest_first(q8, weights, cache, seq_lens, page_table, max_len):
        logits = naive.indexer_logits_fp32(q8, weights, cache, seq_lens, page_table, max_len)
        return torch.where(torch.isfinite(logits), -logits, logits)

    good = check_module.e2e_figures(SMALL_E2E, torch.device("cpu"), dict(bf16_gemm.IMPLEMENTATIONS))
    bad = check_module.e2e_figures(SMALL_E2E, torch.device("cpu"), dict(bf16_gemm.IMPLEMENTATIONS, indexer_logits=lowest_first))
    bound = check_module.BOUNDS["indexer_block_rel_worst"]
    assert good["indexer_block_rel_worst"] < bound / 10, good
    assert bad["indexer_block_rel_worst"] > 3 * bound, bad


def test_check_fails_closed_without_the_model(torch_path, monkeypatch):
    def missing(settings, device, impls):
        raise ImportError("no module named dsv4opt.workload.model")

    monkeypatch.setattr(check_module, "e2e_figures", missing)
    result = run_check(torch.device("cpu"), dict(bf16_gemm.IMPLEMENTATIONS), e2e=SMALL_E2E)
    assert not result.passed
    assert "end-to-end not measured" in result.summary
