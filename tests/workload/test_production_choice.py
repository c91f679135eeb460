"""Which of SGLang 0.5.23's own kernels a Hopper-path run uses (production/choice.py), and the
workload's wiring of them, on a CPU: the real kernels are replaced by fakes that compute the same
functions with our stand-ins and count their calls, so a step through the wiring must equal the
stand-in step exactly and call each real entry point where SGLang calls it."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from dsv4opt.capture.settings import EmbeddedSettings
from dsv4opt.errors import DsvOptError
from dsv4opt.workload.config import ModelConfig
from dsv4opt.workload.kernels.linear import block_fp8_matmul, group_quant_fp8
from dsv4opt.workload.kernels.mhc import hc_post
from dsv4opt.workload.kernels.mhc_fused import hc_pre_big_fuse, hc_pre_gemm
from dsv4opt.workload.model import DecodeWorkload
from dsv4opt.workload.production import artefacts, choice
from dsv4opt.workload.production.artefacts import DEEPGEMM, FAMILIES, MARLIN, MHC, Availability
from dsv4opt.workload.production.choice import KernelChoice, choose

TINY = ModelConfig.from_name("dsv4-tiny")


def found(**not_ready: str) -> list[Availability]:
    """availability() as a Hopper machine with the cache would answer, families in `not_ready` (key ->
    reason) not ready."""
    return [Availability(f, f.key not in not_ready, not_ready.get(f.key, "")) for f in FAMILIES]


# ---- the choice ---------------------------------------------------------------------------------

def test_everything_real_on_a_ready_hopper_machine():
    c = choose("0.5.23", "cuda", bf16=True, tensor_parallel=True, found=found(), flashmla=True)
    assert (c.deep_gemm, c.marlin, c.mhc, c.notes) == (True, True, True, ())
    parts = c.parts()
    assert parts["qkv"] == parts["o_proj"] == ("SGLang 0.5.23: DeepGEMM fp8_gemm_nt (stand-in: Triton UE8M0 "
                                               "activation quant)")
    # what of ours runs inside a part SGLang's kernel holds is named, so no share is read as all SGLang's
    assert "stand-in: torch align" in parts["moe"] and "stand-in: Triton top-k" in parts["indexer"]
    assert parts["moe"].startswith("SGLang 0.5.23: Marlin moe_wna16_marlin_gemm")
    assert parts["indexer"].startswith("SGLang 0.5.23: DeepGEMM fp8_paged_mqa_logits")
    assert parts["mhc_pre"].startswith("SGLang 0.5.23: TileLang")
    assert parts["attn"].startswith("FlashMLA")


def test_cpu_runs_every_stand_in_with_one_line():
    c = choose("0.5.23", "cpu", bf16=False, tensor_parallel=True)
    assert not c.any_real
    assert c.notes == ("stand-in for DeepGEMM, Marlin, TileLang mHC: this run is on the CPU",)
    assert all(v.startswith("stand-in: ") for k, v in c.parts().items())


def test_reasons_are_grouped_and_follow_the_dependencies():
    missing = "no deep_gemm build in /c; run `dsv4opt build-kernels`"
    c = choose("0.5.23", "cuda", bf16=True, tensor_parallel=False, found=found(deep_gemm=missing))
    assert (c.deep_gemm, c.marlin, c.mhc) == (False, False, False)
    assert c.notes == (
        f"stand-in for DeepGEMM: {missing}",
        "stand-in for Marlin: Marlin is wired for the recipe's tensor-parallel layouts (every expert local)",
        "stand-in for TileLang mHC: TileLang's mHC runs beside DeepGEMM's tf32 pre-norm GEMM, which is not ready",
    )
    c = choose("0.5.23", "cuda", bf16=False, tensor_parallel=True, found=found())
    assert not c.any_real and c.notes == ("stand-in for DeepGEMM, Marlin, TileLang mHC: SGLang's kernels take bf16 "
                                          "activations; this run's dtype is not bf16",)


def test_modes():
    c = choose("0.5.23", "cuda", bf16=True, tensor_parallel=True, mode="stand-in", found=found())
    assert not c.any_real and len(c.notes) == 1
    with pytest.raises(DsvOptError, match=r"^--kernels sglang: stand-in for Marlin: no marlin build"):
        choose("0.5.23", "cuda", True, True, mode="sglang", found=found(marlin="no marlin build in /c"))
    assert choose("0.5.23", "cuda", True, True, mode="sglang", found=found()).any_real
    with pytest.raises(DsvOptError, match="wired for the 0.5.23 path only"):
        choose("0.5.14", "cuda", True, True, mode="sglang")
    assert choose("0.5.14", "cuda", True, True) == KernelChoice()
    with pytest.raises(DsvOptError, match="unknown kernels mode 'sglng'; did you mean sglang"):
        choose("0.5.23", "cpu", False, True, mode="sglng")
    with pytest.raises(DsvOptError, match="unknown kernels mode"):
        EmbeddedSettings(sglang_kernels="real").check_names()


def test_the_cache_decides_on_a_hopper_machine(tmp_path):
    """Through availability(): an empty cache keeps every family on its stand-in, named once."""
    hopper = artefacts.Machine((9, 0), "/usr/bin/nvcc", (3, 12))
    c = choose("0.5.23", "cuda", True, True, found=artefacts.availability(tmp_path, hopper))
    assert not c.any_real
    assert all("run `dsv4opt build-kernels`" in n for n in c.notes[:2])


# ---- the wiring, with fakes in the real kernels' places ----------------------------------------

@pytest.fixture
def fake_kernels(monkeypatch):
    """SGLang's entry points replaced by our stand-ins' arithmetic, counting calls."""
    from dsv4opt import tritonlib
    from dsv4opt.workload import baseline
    from dsv4opt.workload.kernels.grouped_moe import grouped_routed_experts
    from dsv4opt.workload.production import deepgemm, marlin, mhc_tilelang
    from dsv4opt.workload.weights import Mxfp4Experts

    calls = Counter()
    cfg = TINY

    def fp8_linear(x, w8, w_scale):
        calls["fp8_gemm_nt"] += 1
        q, s = group_quant_fp8(x, cfg.fp8_block)
        return block_fp8_matmul(q, s, w8, w_scale, cfg.fp8_block, x.dtype, True)

    def paged_mqa_schedule(seq_lens, page_size):
        calls["schedule"] += 1
        return ("schedule", seq_lens.data_ptr())

    def paged_mqa_logits(q8, weights, cache, seq_lens, page_table, max_len, schedule):
        calls["paged_mqa_logits"] += 1
        assert schedule == ("schedule", seq_lens.data_ptr())
        return baseline.index_logits_fp8(q8, weights, cache, seq_lens, page_table, max_len)

    def hc_prenorm_gemm(flat, fn, splits):
        calls["tf32_hc_prenorm_gemm"] += 1
        return hc_pre_gemm(flat.view(flat.shape[0], cfg.hc, -1), fn)

    def big_fuse(mix, sq, residual, scale, base, norm):
        calls["big_fuse"] += 1
        return hc_pre_big_fuse(mix, sq, residual, scale, base, norm, cfg.hc, cfg.hc_sinkhorn_iters, cfg.hc_eps,
                               cfg.norm_eps, residual.dtype)

    def post(y, residual, post_mix, comb):
        calls["post"] += 1
        return hc_post(y, residual, post_mix, comb)

    def post_pre_fma(y, residual, post_mix, comb, fn, tile_n, splits):
        calls["post_pre_fma"] += 1
        out = hc_post(y, residual, post_mix, comb)
        return (out, *hc_pre_gemm(out, fn))

    def from_mxfp4(packed, scales):
        calls["marlin_repack"] += 1
        return Mxfp4Experts.of(packed, scales)

    def routed_experts(x, ids, gates, m13, m2, limit, scale):
        calls["marlin_moe"] += 1
        return grouped_routed_experts(x, ids, gates, m13, m2, limit, scale)

    monkeypatch.setattr(deepgemm, "fp8_linear", fp8_linear)
    monkeypatch.setattr(deepgemm, "paged_mqa_schedule", paged_mqa_schedule)
    monkeypatch.setattr(deepgemm, "paged_mqa_logits", paged_mqa_logits)
    monkeypatch.setattr(deepgemm, "hc_prenorm_gemm", hc_prenorm_gemm)
    real_new_step = deepgemm.new_step
    monkeypatch.setattr(deepgemm, "new_step", lambda: (calls.update(["new_step"]), real_new_step()))
    monkeypatch.setattr(mhc_tilelang, "big_fuse", big_fuse)
    monkeypatch.setattr(mhc_tilelang, "post", post)
    monkeypatch.setattr(mhc_tilelang, "post_pre_fma", post_pre_fma)
    monkeypatch.setattr(marlin.MarlinExperts, "from_mxfp4", staticmethod(from_mxfp4))
    monkeypatch.setattr(marlin, "routed_experts", routed_experts)
    monkeypatch.setattr(tritonlib, "sm_count", lambda device: 132)
    return calls


def test_a_step_through_sglangs_entry_points_equals_the_stand_in_step(fake_kernels, monkeypatch, torch_path):
    """Every family 'real': the step calls SGLang's entry points where SGLang does (one schedule a
    step, the post of each block fused into the next pre, the last post alone) and, the fakes being
    the stand-ins' arithmetic, its logits equal the stand-in step's bit for bit. Two tokens, two
    steps: the second with SGLang's FMA threshold lowered to 1, which takes its path of more than 32
    tokens (interpreting 33 tokens takes minutes)."""
    from dsv4opt.workload.production import mhc_tilelang

    C, L = 2, TINY.layers
    csa = sum(TINY.layer_kind(i) == "csa" for i in range(L))
    kw = dict(concurrency=C, context=40, dtype=torch.float32, seed=0, sglang="0.5.23")
    tokens = torch.arange(C) % TINY.vocab
    stand_in = DecodeWorkload(TINY, **kw)
    real = DecodeWorkload(TINY, kernels=KernelChoice(deep_gemm=True, marlin=True, mhc=True), **kw)
    assert dict(fake_kernels) == {"marlin_repack": 2 * L}  # once at load, w13 and w2 of each layer
    for fma_max in (32, 1):
        monkeypatch.setattr(mhc_tilelang, "FMA_MAX_TOKENS", fma_max)
        fake_kernels.clear()
        assert torch.equal(real.step(tokens), stand_in.step(tokens)), fma_max
        assert fake_kernels["new_step"] == 1 and fake_kernels["schedule"] == 1
        assert fake_kernels["paged_mqa_logits"] == csa
        assert fake_kernels["marlin_moe"] == L
        # the step's first read: the tf32 GEMM and the big fuse; each of the 2L - 1 later boundaries
        # through fused_post_pre: the FMA kernel up to the threshold, else post and the tf32 GEMM;
        # the last block's post alone
        assert fake_kernels["big_fuse"] == 2 * L
        fused = (fake_kernels["post_pre_fma"], fake_kernels["post"], fake_kernels["tf32_hc_prenorm_gemm"])
        assert fused == ((2 * L - 1, 1, 1) if C <= fma_max else (0, 2 * L, 2 * L)), fma_max
        # dense linears: wqkv_a, wq_b, wo_b, the shared expert's two, and idx_wq_b on CSA layers
        assert fake_kernels["fp8_gemm_nt"] == 5 * L + csa


def test_choice_on_a_cpu_profile_is_recorded(tmp_path):
    """A CPU profile of the Hopper path says which kernel ran each part, and the reason, in its meta."""
    from dsv4opt.capture.rank_run import plan_run

    plan = plan_run(EmbeddedSettings(concurrency=2, context=24, sglang="0.5.23", device="cpu", config="dsv4-tiny"))
    assert "stand-in for DeepGEMM, Marlin, TileLang mHC: this run is on the CPU" in plan.notes
    assert not plan.kernels.any_real
    with pytest.raises(DsvOptError, match="--kernels sglang: stand-in for DeepGEMM, Marlin, TileLang mHC: this run is on the CPU"):
        plan_run(EmbeddedSettings(concurrency=2, context=24, sglang="0.5.23", device="cpu", config="dsv4-tiny",
                                  sglang_kernels="sglang"))


def test_memory_estimate_counts_the_marlin_copies():
    """With Marlin's MoE the experts are also held in Marlin's layout (repacked at load, as SGLang
    does); the estimate the run is refused by counts them, byte for byte."""
    from dsv4opt.workload.memory import estimate_memory

    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.float32, sglang="0.5.23",
                        kernels=KernelChoice(marlin=True))
    assert wl.layers[0].w["w13"].marlin is not None
    est = estimate_memory(TINY, 2, 40, elem_bytes=4, marlin_copies=True)
    assert est.weights == wl.state_bytes()["weights"]
    assert estimate_memory(TINY, 2, 40, elem_bytes=4).weights < est.weights


def test_apply_re_profiles_with_the_kernels_the_profile_ran():
    """A profile from before the setting ran our stand-ins: re-profiling it (apply) keeps them, so the
    before/after pair compares; a newer one carries its mode; the per-part meta is never read as one."""
    legacy = EmbeddedSettings.from_meta({"settings": {"sglang": "0.5.23", "concurrency": 4}})
    assert legacy.sglang_kernels == "stand-in"
    new = EmbeddedSettings.from_meta({"settings": {"sglang": "0.5.23", "sglang_kernels": "auto"},
                                      "kernels": {"moe": "SGLang 0.5.23: Marlin moe_wna16_marlin_gemm"}})
    assert new.sglang_kernels == "auto"
    new.check_names()


def test_the_build_fits_flash_shapes_and_names_what_it_does_not():
    """The TileLang cubins are DeepSeek-V4-Flash's widths with big fuses of 4, 8 and 64 splits; SGLang's
    split count (min(SMs // ceil(T / 64), 64)) leaves them past 128 tokens on 132 SMs, past 64 on 114."""
    from dsv4opt.workload.production.choice import fits_the_build

    flash = ModelConfig.from_name("dsv4-flash")
    assert all(fits_the_build(flash, c, 132) == {} for c in (1, 7, 8, 32, 33, 64, 128))
    assert fits_the_build(flash, 129, 132) == {
        "mhc": "at 129 tokens on 132 SMs SGLang's big fuse takes 44 splits, a cubin not built (built: 4, 8, 64)"}
    assert "57 splits" in fits_the_build(flash, 65, 114)["mhc"]
    tiny = fits_the_build(TINY, 2, 132)
    assert set(tiny) == {"deep_gemm", "mhc"} and "DeepSeek-V4-Flash's mHC widths" in tiny["mhc"]
    c = choose("0.5.23", "cuda", True, True, found=found(), shapes=fits_the_build(flash, 129, 132))
    assert (c.deep_gemm, c.marlin, c.mhc) == (True, True, False) and len(c.notes) == 1


def test_inconsistent_choices_are_refused():
    with pytest.raises(ValueError, match="mhc needs deep_gemm"):
        KernelChoice(mhc=True)
    with pytest.raises(DsvOptError, match="wired for the Hopper path"):
        DecodeWorkload(TINY, concurrency=1, context=8, dtype=torch.float32, kernels=KernelChoice(deep_gemm=True))


def test_torch_compile_is_refused_over_sglangs_kernels(monkeypatch):
    from dsv4opt.capture import rank_run
    from dsv4opt.errors import CaptureError

    monkeypatch.setattr(rank_run, "choose", lambda *a, **k: KernelChoice(deep_gemm=True))
    monkeypatch.setattr(rank_run, "first_calls", lambda device: {"deep_gemm": lambda: None})
    settings = EmbeddedSettings(concurrency=2, context=24, sglang="0.5.23", device="cpu", config="dsv4-tiny",
                                optimizations=["torch-compile"])
    with pytest.raises(CaptureError, match="^torch-compile cannot compile through SGLang's own kernels yet"):
        rank_run.plan_run(settings)


def test_a_family_whose_first_call_fails_keeps_its_stand_in():
    """The cache can be present and a kernel still fail at its first call (DeepGEMM's JIT, say): the run
    falls back to the stand-in with one line saying why, or under --kernels sglang refuses in it."""
    from dsv4opt.workload.production.choice import verified

    called = []

    def ok(key):
        return lambda: called.append(key)

    def jit_fails():
        called.append("deep_gemm")
        raise RuntimeError("NVRTC compilation failed: cannot open source file cuda/std/cstdint\nmore")

    every = KernelChoice(deep_gemm=True, marlin=True, mhc=True, flashmla=True)
    c = verified(every, {"deep_gemm": jit_fails, "marlin": ok("marlin"), "mhc": ok("mhc")})
    assert (c.deep_gemm, c.marlin, c.mhc, c.flashmla) == (False, True, False, True)
    assert called == ["deep_gemm", "marlin"]  # mHC is not tried without DeepGEMM beside it
    assert c.notes == ("stand-in for DeepGEMM: its first call failed here (RuntimeError: NVRTC compilation failed: "
                       "cannot open source file cuda/std/cstdint)",
                       "stand-in for TileLang mHC: TileLang's mHC runs beside DeepGEMM's tf32 pre-norm GEMM, which "
                       "is not ready")
    with pytest.raises(DsvOptError, match="^--kernels sglang: stand-in for DeepGEMM: its first call failed"):
        verified(every, {"deep_gemm": jit_fails, "marlin": ok("marlin"), "mhc": ok("mhc")}, mode="sglang")
    assert verified(every, {k: ok(k) for k in ("deep_gemm", "marlin", "mhc")}) == every
