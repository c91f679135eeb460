"""bf16-gemm: kernels against the float32/float64 references, and a gate that can fail.

The Triton kernels run under the interpreter in float16 (it cannot multiply bf16); the bf16 path
on the CPU is the torch emulation, tested against float64 on the same rounded inputs.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import dsv4opt.optimizations.bf16_gemm as bf16_gemm  # noqa: E402
from dsv4opt.numerics import error_report  # noqa: E402
from dsv4opt.optimizations.bf16_gemm import kernel, naive  # noqa: E402
from dsv4opt.optimizations.bf16_gemm.check import E2ESettings, run_check, selection_figures  # noqa: E402
from dsv4opt.optimizations.registry import get  # noqa: E402

# The package exports the function `check`, which hides the submodule of the same name.
check_module = importlib.import_module("dsv4opt.optimizations.bf16_gemm.check")
interpreted = pytest.mark.skipif(not kernel._INTERPRETED, reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")

SMALL_E2E = E2ESettings(config="dsv4-tiny", concurrency=4, context=64, steps=4, layers=None)


def _indexer_inputs(B, H, D, S, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, D, generator=gen).to(dtype)
    keys = torch.randn(B, S, D, generator=gen) * 3
    scale = keys.abs().amax(-1).clamp(min=1e-6) / 448.0 if S else torch.ones(B, 0)
    k = (keys / scale.unsqueeze(-1)).to(torch.float8_e4m3fn)
    w = torch.randn(B, H, generator=gen)
    return q, k, scale, w


INDEXER_SHAPES = [  # (B, Hi, Di, S)
    pytest.param(1, 4, 16, 5, id="batch1-fewer-entries-than-tile"),
    pytest.param(2, 20, 48, 70, id="heads-and-dim-not-pow2"),
    pytest.param(3, 64, 128, 130, id="flash-heads-entries-not-tile"),
    pytest.param(2, 8, 32, 0, id="no-entries"),
]


@interpreted
@pytest.mark.parametrize("B,H,D,S", INDEXER_SHAPES)
def test_indexer_kernel_matches_float64(B, H, D, S):
    q, k, scale, w = _indexer_inputs(B, H, D, S, torch.float16)
    out = kernel.indexer_score_lowp(q, k, scale, w)
    ref = naive.indexer_score_ref(q, k, scale, w, torch.float64)
    err = error_report(out, ref)
    assert err.ok(1e-5), err


@pytest.mark.parametrize("B,H,D,S", INDEXER_SHAPES)
def test_indexer_bf16_path_matches_float64(B, H, D, S):
    """bf16 q and fp8 keys are exact in fp32 products, so only fp32 summation error remains."""
    q, k, scale, w = _indexer_inputs(B, H, D, S, torch.bfloat16)
    out = bf16_gemm.indexer_score(q, k, scale, w)
    err = error_report(out, naive.indexer_score_ref(q, k, scale, w, torch.float64))
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
    "p_q": "*bf16", "p_k": "*fp8e4nv", "p_scale": "*fp32", "p_w": "*fp32", "p_out": "*fp32", "S": "i32",
    "s_qb": "i32", "s_qh": "i32", "s_kb": "i32", "s_ks": "i32", "s_sb": "i32", "s_wb": "i32", "s_ob": "i32",
}
PREMIX_SIGNATURE = {
    "p_x": "*fp32", "p_w": "*bf16", "p_part": "*fp32", "T": "i32", "N": "i32", "K": "i32",
    "s_xt": "i32", "s_wn": "i32", "s_ps": "i32", "s_pt": "i32",
}


@pytest.mark.parametrize("name,signature,constexprs", [
    pytest.param("_indexer_score_mm_kernel", INDEXER_SIGNATURE,
                 {"H": 64, "D": 128, "BLOCK_S": 64, "BLOCK_H": 64, "BLOCK_D": 128}, id="indexer-flash"),
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


def test_references_agree_with_the_workload():
    """naive.py is this package's definition of correct; it must be the workload's float32 path."""
    baseline = pytest.importorskip("dsv4opt.workload.baseline")
    from dsv4opt.workload import naive as workload_naive
    from dsv4opt.workload.ops import hc_split

    q, k, scale, w = _indexer_inputs(3, 64, 128, 300, torch.bfloat16)
    ours = naive.indexer_score_ref(q, k, scale, w)
    assert error_report(ours, baseline.indexer_score_fp32(q, k, scale, w)).ok(1e-6)
    assert error_report(ours, workload_naive.indexer_score_ref(q, k, scale, w)).ok(1e-6)
    x, weight = torch.randn(7, 512), torch.randn(24, 512)
    assert error_report(naive.hc_premix_ref(x, weight), baseline.hc_premix_fp32(x, weight)).ok(1e-6)
    mix, scale3, base = torch.randn(7, 24), torch.rand(3) + 0.5, torch.randn(24)
    for a, b in zip(naive.hc_split_sinkhorn(mix, scale3, base, 4, 20, 1e-6), hc_split(mix, scale3, base, 4, 20, 1e-6)):
        assert error_report(a, b).ok(1e-6)


def test_registry_resolves_both_slots_to_this_package():
    from dsv4opt.workload.impls import resolve

    impls = resolve(["bf16-gemm"])
    assert impls["indexer_score"] is bf16_gemm.indexer_score
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


@pytest.fixture
def torch_attention(monkeypatch):
    """The baseline attention through its plain-torch path: the gate is under test, not the SIMT kernel."""
    import dsv4opt.workload.baseline as baseline
    from dsv4opt.workload.attention.torch_path import sparse_decode_torch

    monkeypatch.setitem(baseline.IMPLEMENTATIONS, "attention", sparse_decode_torch)


def _bad_indexer(q, k, k_scale, w):
    """A plausible mistake: index queries squeezed to fp8 e4m3."""
    return naive.indexer_score_ref(q.to(torch.float8_e4m3fn).to(q.dtype), k, k_scale, w)


def _bad_premix(x, weight):
    """A plausible mistake: the pre-mix weight stored in fp8 e4m3 without a scale."""
    return naive.hc_premix_ref(x, weight.to(torch.float8_e4m3fn).float())


def test_check_passes_with_the_real_implementations(torch_attention):
    """The default CPU end-to-end size: 128 greedy decisions, so one near-tie flip is not 5%."""
    result = run_check(torch.device("cpu"), dict(bf16_gemm.IMPLEMENTATIONS))
    assert result.passed, result.summary
    assert set(result.bounds) <= set(result.figures)


def test_check_fails_closed_on_a_bad_indexer(torch_attention):
    impls = dict(bf16_gemm.IMPLEMENTATIONS, indexer_score=_bad_indexer)
    result = run_check(torch.device("cpu"), impls, e2e=SMALL_E2E)
    assert not result.passed
    assert result.figures["recall_loss_mean"] > result.bounds["recall_loss_mean"]
    assert "FAILED" in result.summary and "recall_loss_mean" in result.summary


def test_registered_check_fails_closed_on_a_bad_premix(torch_attention, monkeypatch):
    """Through the registry, so the end-to-end part runs the bad pre-mix inside the model too."""
    monkeypatch.setattr(bf16_gemm, "IMPLEMENTATIONS", dict(bf16_gemm.IMPLEMENTATIONS, hc_premix=_bad_premix))
    monkeypatch.setattr(check_module, "_e2e_settings", lambda device: SMALL_E2E)
    result = get("bf16-gemm").check("cpu")
    assert not result.passed
    for name in ("premix_rel_pre", "premix_rel_post", "premix_rel_comb"):
        assert result.figures[name] > result.bounds[name], (name, result.summary)


def test_end_to_end_part_fails_on_a_broken_indexer(torch_attention, monkeypatch):
    """The model-level figures alone catch an indexer that picks the lowest-scored entries."""
    def lowest_first(q, k, k_scale, w):
        return -naive.indexer_score_ref(q, k, k_scale, w)

    monkeypatch.setattr(bf16_gemm, "IMPLEMENTATIONS", dict(bf16_gemm.IMPLEMENTATIONS, indexer_score=lowest_first))
    figures = check_module.e2e_figures(SMALL_E2E, torch.device("cpu"))
    for name in ("hidden_rel_mean_vs_control", "hidden_rel_worst_vs_control", "greedy_disagree_excess"):
        assert figures[name] > check_module.BOUNDS[name], (name, figures)


def test_check_fails_closed_without_the_model(torch_attention, monkeypatch):
    def missing(settings, device):
        raise ImportError("no module named dsv4opt.workload.model")

    monkeypatch.setattr(check_module, "e2e_figures", missing)
    result = run_check(torch.device("cpu"), dict(bf16_gemm.IMPLEMENTATIONS), e2e=SMALL_E2E)
    assert not result.passed
    assert "end-to-end not measured" in result.summary
