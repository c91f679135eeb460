"""The SGLang paths the embedded workload reproduces (dsv4opt/workload/paths.py): the Hopper path of
0.5.23 computes the model's function (against the float64 reference, which follows each path's
routed scale), differs from the sm_120 path only where SGLang's paths differ, and calls FlashMLA as
SGLang's backend does."""

from __future__ import annotations

import pytest
import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.numerics import error_report
from dsv4opt.workload.attention import flashmla
from dsv4opt.workload.config import ModelConfig
from dsv4opt.workload.kvcache import KVCache, KVLayout
from dsv4opt.workload.model import DecodeWorkload
from dsv4opt.workload.paths import PATHS, SGLangPath
from dsv4opt.workload.reference import decode_step_ref

TINY = ModelConfig.from_name("dsv4-tiny")
REL_TOL = 3e-2


def _steps_match(wl, tokens, steps):
    for _ in range(steps):
        ref_logits, ref_hidden = decode_step_ref(wl, tokens)
        logits = wl.step(tokens)
        for out, ref in ((logits, ref_logits), (wl.last_hidden, ref_hidden)):
            report = error_report(out, ref)
            assert report.ok(REL_TOL), report
        tokens = logits.argmax(-1)


@pytest.mark.parametrize("layout,graph_context", [("tp4", None), ("tp4", TINY.max_context), ("dp-ep", None)])
def test_hopper_path_matches_float64_reference(layout, graph_context, torch_path):
    wl = DecodeWorkload(TINY, concurrency=3, context=40, dtype=torch.float32, seed=1, layout=layout,
                        graph_context=graph_context, sglang="0.5.23")
    # wo_a bf16: SGLang turns its FP8 GEMM off on sm_90 unless the variable is set (docs/production-kernels.md)
    assert wl.path.fused_mhc_pre and isinstance(wl.layers[0].w["wo_a"], torch.Tensor)
    _steps_match(wl, torch.tensor([3, 9, 11]), 2)


def test_hopper_path_with_fp8_wo_a_matches_float64_reference(torch_path, monkeypatch):
    """What a user who sets SGLANG_OPT_FP8_WO_A_GEMM runs: wo_a as one block-FP8 GEMM a group."""
    import dataclasses

    from dsv4opt.workload import paths

    monkeypatch.setitem(paths.PATHS, "0.5.23", dataclasses.replace(paths.PATHS["0.5.23"], fp8_wo_a=True))
    wl = DecodeWorkload(TINY, concurrency=3, context=40, dtype=torch.float32, seed=1, sglang="0.5.23")
    assert isinstance(wl.layers[0].w["wo_a"], list)
    _steps_match(wl, torch.tensor([3, 9, 11]), 2)


@pytest.mark.slow
def test_hopper_path_triton_kernels_match_float64_reference():
    """The path's Triton kernels (the fused pre step, FP8 logits, grouped MoE) under the
    interpreter, in fp16 (the interpreter cannot multiply bf16)."""
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.float16, seed=2, sglang="0.5.23")
    tokens = torch.tensor([3, 9])
    ref, _ = decode_step_ref(wl, tokens)
    assert error_report(wl.step(tokens), ref).ok(0.1)


def test_the_paths_differ_where_sglang_differs(torch_path):
    """Same weights and caches on both paths, yet different logits: 0.5.23 scales the routed experts
    once, the sm_120 path twice; the reference follows each (so it is not vacuous)."""
    tokens = torch.tensor([3, 9, 11])
    out = {name: DecodeWorkload(TINY, concurrency=3, context=40, dtype=torch.float32, seed=1, sglang=name).step(tokens)
           for name in PATHS}
    assert not error_report(out["0.5.23"], out["0.5.14"]).ok(10 * REL_TOL)


def test_the_hopper_recipe_is_the_default_layout():
    wl = DecodeWorkload(TINY, concurrency=1, context=8, dtype=torch.float32, sglang="0.5.23")
    assert wl.deploy.layout == PATHS["0.5.23"].layout == "tp4"


def test_an_unknown_path_is_a_one_line_error():
    with pytest.raises(DsvOptError, match="unknown SGLang path '0.5.99'; use 0.5.14, 0.5.23"):
        SGLangPath.from_name("0.5.99")


def test_flashmla_takes_sglangs_pool_views():
    """k_cache as the backend passes it: e4m3 [pages, page_size, 1, 584], the page stride kept."""
    layout = KVLayout(True, 448, 64, 64, 64)
    cache = KVCache.allocate(layout, 3, torch.bfloat16, "cpu")
    view = flashmla.k_cache_view(cache)
    assert view.shape == (3, 64, 1, 584) and view.dtype == torch.float8_e4m3fn
    assert view.stride() == (layout.page_bytes, 584, 584, 1)
    assert view.data_ptr() == cache.data.data_ptr()


def test_flashmla_stands_aside_off_hopper(torch_path):
    """On a CPU the sm_120 kernel computes the slot in FlashMLA's place."""
    wl = DecodeWorkload(TINY, concurrency=2, context=40, dtype=torch.float32, sglang="0.5.23")
    assert wl.impls["attention"] is flashmla.sparse_decode_flashmla
    assert not flashmla.runs_flashmla(torch.zeros(1, 64, 512), wl.layers[0].swa)


def test_a_missing_flashmla_is_named(monkeypatch):
    monkeypatch.setattr(flashmla.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DsvOptError, match=r"pip install --no-deps sgl-flash-mla==1\.0\.0"):
        flashmla.flash_mla_module()


def _hopper_with_flashmla() -> bool:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return False
    try:
        flashmla.flash_mla_module()
    except DsvOptError:
        return False
    return True


@pytest.mark.skipif(not _hopper_with_flashmla(), reason="needs a Hopper GPU with sgl-flash-mla 1.0.0")
def test_flashmla_in_the_model_matches_the_sm120_kernel(monkeypatch):
    """FlashMLA itself in every attention block of a 4-layer dsv4-flash (window, CSA, HCA layers) against
    the sm_120 kernel on the same input and state: the views, index rows and sink are passed right."""
    from dsv4opt.workload.attention.sm120 import sparse_decode_sm120

    calls = []
    real = flashmla.flash_mla_module
    monkeypatch.setattr(flashmla, "flash_mla_module", lambda: calls.append(1) or real())
    flash = ModelConfig.from_name("dsv4-flash")
    wl = DecodeWorkload(flash, concurrency=5, context=700, layers=4, device="cuda", sglang="0.5.23")
    rel = {}
    wl.compare_impls = {"attention": sparse_decode_sm120}
    wl.on_block = lambda block, i, out, other: rel.setdefault((block, i), error_report(out, other).rel)
    wl.step(torch.arange(5, device="cuda"))
    assert len(calls) == 4  # one FlashMLA call a layer; the sm_120 kernel ran in the comparison only
    # one scheduler metadata a compress ratio (window-only, C4, C128), shared by the layers of that ratio
    assert set(flashmla._STEP_METADATA) == {0, 4, 128}
    attention = {k: v for k, v in rel.items() if k[0] == "attention_block"}
    assert len(attention) == 4 and max(attention.values()) < 2e-2, rel


def test_a_hopper_gpu_without_flashmla_is_refused_before_building(monkeypatch):
    """The profile refuses at once, in one line, rather than after minutes of building the model."""
    import dsv4opt.capture.rank_run as rank_run
    from dsv4opt.capture.settings import EmbeddedSettings
    from dsv4opt.errors import CaptureError

    monkeypatch.setattr(rank_run, "missing_on", lambda device: "the SGLang 0.5.23 Hopper path runs FlashMLA itself")
    with pytest.raises(CaptureError, match="runs FlashMLA itself"):
        rank_run.plan_run(EmbeddedSettings(config="dsv4-tiny", device="cpu", sglang="0.5.23"))
    rank_run.plan_run(EmbeddedSettings(config="dsv4-tiny", device="cpu"))  # the default path needs no FlashMLA


def test_off_hopper_nothing_is_missing():
    assert flashmla.missing_on(torch.device("cpu")) is None
