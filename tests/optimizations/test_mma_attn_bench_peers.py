"""The peers of `dsv4opt bench mma-attn` (bench_peers.py) on a CPU: the shipped FlashMLA is called with
exactly what SGLang 0.5.23's wrapper passes it (SGLang's wrapper from the wheel, FlashMLA's entry
recorded), the Hopper slot with exactly the backend's keywords, the bench's reference and error
measure catch what they should, and the table states the targets from the figures it is given. The
timing itself needs the H200 (docs/sglang.md has the command)."""

from __future__ import annotations

import functools

import pytest
import torch
from rich.console import Console

from dsv4opt.optimizations.mma_attn import bench_peers as P
from dsv4opt.optimizations.mma_attn import sglang_contract as C
from dsv4opt.optimizations.mma_attn import sglang_entry as E
from dsv4opt.workload.kvcache import KVCache
from tests.optimizations.test_mma_attn_sglang import INTERPRETED
from tests.sglang.test_sglang_wheels import flash_mla, sglang  # noqa: F401  (fixtures)

SCALE = C.DIM**-0.5


def inputs(B: int = 2, H: int = 8, seed: int = 0, widths: tuple[int, int] = (128, 192)):
    """The bench's input set on a CPU, smaller: window pages of 256, compressed pages of 64, every slot used."""
    gen = torch.Generator().manual_seed(seed)
    swa = KVCache.allocate(C.layout(C.KV_PAGE), B, torch.bfloat16, "cpu")
    extra = KVCache.allocate(C.layout(64), 8, torch.bfloat16, "cpu")
    swa.fill_random(gen)
    extra.fill_random(gen)

    def pick(cache, width):
        idx = torch.stack([torch.randperm(cache.tokens, generator=gen)[:width] for _ in range(B)]).to(torch.int32)
        return idx, torch.full((B,), width, dtype=torch.int32)

    q = torch.randn(B, H, C.DIM, generator=gen).to(torch.bfloat16).to(torch.float16)
    return (q, *pick(swa, widths[0]), *pick(extra, widths[1]), torch.randn(H, generator=gen)), swa, extra


def test_backend_kwargs_are_the_backends_call():
    s, swa, extra = inputs()
    kw = P.backend_kwargs(s, swa, extra, SCALE, meta="meta")
    assert list(kw) == list(C.FLASHMLA_CALL_KEYWORDS)
    k = kw["k_cache"]
    assert k.dtype == torch.float8_e4m3fn and k.shape == (2, C.KV_PAGE, 1, C.TOKEN_BYTES)
    assert k.stride() == (C.page_bytes(C.KV_PAGE), C.TOKEN_BYTES, C.TOKEN_BYTES, 1)
    assert k.data_ptr() == swa.data.data_ptr() and kw["extra_k_cache"].shape[1] == 64
    assert kw["q"].shape == (2, 1, 8, C.DIM) and kw["indices"].shape == (2, 1, 128)
    assert kw["extra_indices_in_kvcache"].shape == (2, 1, 192) and kw["tile_scheduler_metadata"] == "meta"


def test_shipped_flashmla_gets_what_sglang_0_5_23s_wrapper_passes(sglang, flash_mla):  # noqa: F811
    sglang(C.SGLANG_023)
    from sglang.kernels.ops.attention import flash_mla_interface

    recorded = []
    flash_mla.flash_mla_with_kvcache = lambda **kw: recorded.append(kw) or ("out", "lse")
    s, swa, extra = inputs()
    meta = flash_mla_interface.get_mla_metadata()[0]
    call = P.backend_kwargs(s, swa, extra, SCALE, meta)
    assert functools.partial(flash_mla_interface.flash_mla_with_kvcache, use_legacy=True)(**call) == ("out", "lse")
    ours = P.flash_mla_kwargs(call)
    [theirs] = recorded
    assert theirs.keys() == ours.keys()
    for key in theirs:
        assert theirs[key] is ours[key] or theirs[key] == ours[key], key


@pytest.mark.skipif(not INTERPRETED, reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")
def test_the_slot_as_the_bench_calls_it_meets_the_benchs_reference():
    s, swa, extra = inputs(seed=1)
    o_ref, lse_ref, bare_ref = P.reference(s, swa, extra, SCALE)
    out, lse = E.flash_mla_with_kvcache(**P.backend_kwargs(s, swa, extra, SCALE, meta=None), use_legacy=True)
    assert P.rel_err(out.squeeze(1), o_ref) <= P.PEER_TOL
    assert P.rel_err(lse.squeeze(-1), bare_ref) <= P.PEER_TOL_LSE
    assert P.rel_err(lse.squeeze(-1), lse_ref) > P.PEER_TOL_LSE  # the sink left in would be caught


def test_rel_err_counts_nan_and_a_wrong_infinity_as_infinite():
    want = torch.tensor([[1.0, -2.0], [float("inf"), 4.0]])
    assert P.rel_err(want.clone(), want) == 0.0
    assert P.rel_err(torch.tensor([[1.0, -2.0], [float("inf"), 4.02]]), want) == pytest.approx(0.02 / 4)
    assert P.rel_err(torch.tensor([[float("nan"), -2.0], [float("inf"), 4.0]]), want) == float("inf")
    assert P.rel_err(torch.tensor([[1.0, -2.0], [5.0, 4.0]]), want) == float("inf")  # +inf expected, 5 given


def test_without_the_wheel_the_shipped_flashmla_is_skipped_with_the_reason():
    module, why = P.shipped_flash_mla()
    if module is None:
        assert why.startswith("flash_mla does not import here")
    else:
        assert why.startswith("yes")


def test_the_peer_table_fits_80_columns_and_states_the_targets():
    # figures given to the renderer (any would do): the ratios and verdicts are worked out here by hand
    rows = [
        P.PeerRow(32, 40, {P.MMA: (1e-3, 1e-6), P.SLOT: (1e-3, 2e-6), P.SHIPPED: (2e-3, 1e-6)},
                  {P.MMA: True, P.SLOT: True, P.SHIPPED: True}, {P.MMA: 20.0, P.SLOT: 24.0, P.SHIPPED: 25.0}),
        P.PeerRow(64, 20, {P.MMA: (1e-3, 1e-6), P.SLOT: (1e-3, 2e-6), P.SHIPPED: (9e-3, 1e-6)},
                  {P.MMA: True, P.SLOT: True, P.SHIPPED: False}, {P.MMA: 30.0, P.SLOT: 32.0}),
    ]
    result = P.PeerResult({P.MMA: "yes", P.SLOT: "yes", P.SHIPPED: "yes", P.SOURCE: "no library here"}, rows)
    console = Console(record=True, width=80)
    console.print(P.render(result))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    said = " ".join(text.split())
    assert "B = 32: slot 1.04x FlashMLA 1.0.0, target 1.1x: not met" in said  # 25.0 / 24.0
    assert "B = 64: FlashMLA 1.0.0 off by 9.0e-03 (o), 1.0e-06 (lse); FlashMLA 1.0.0: outputs not NaN-poisoned" in said
    assert "B = 64: slot" not in said  # no figure for the shipped FlashMLA there: no verdict
    assert "FlashMLA source: no library here" in said
    row32 = next(ln for ln in text.splitlines() if ln.split()[:1] == ["32"])
    assert row32.split()[1:5] == ["20.0", "24.0", "25.0", "-"] and "1.25" in row32 and "1.04" in row32


@pytest.mark.skipif(not INTERPRETED, reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")
def test_run_peers_wiring_on_a_cpu(monkeypatch):
    """run_peers end to end with the GPU parts stood in for (caches on the CPU, timing by one call,
    FlashMLA 1.0.0 by the float64 reference in FlashMLA's convention): every callable checked, then
    timed; a wrong result is not timed. The speed itself is the H200's to measure."""
    from dsv4opt.optimizations.mma_attn import bench_inputs

    s, swa, extra = inputs(seed=3, widths=(32, 48))  # the wiring, not the kernel: few slots keep the interpreter quick
    calls = []

    class FakeFlashMLA:
        __version__ = "1.0.0"

        @staticmethod
        def get_mla_metadata():
            return object(), None

        @staticmethod
        def flash_mla_with_kvcache(**kw):
            calls.append(kw)
            o, _, bare = P.reference(s, swa, extra, SCALE)
            return o.to(torch.bfloat16).unsqueeze(1), bare.float().unsqueeze(-1)

    monkeypatch.setattr(bench_inputs, "window_cache", lambda kv, batch, gen: swa)
    monkeypatch.setattr(bench_inputs, "input_sets", lambda batch, swa_, extra_, gen: [s, s])
    monkeypatch.setattr(P.timing, "median_graph_ms", lambda fn: (fn(), fn(), 0.001)[-1])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(P, "shipped_flash_mla", lambda: (FakeFlashMLA, "yes"))
    monkeypatch.setattr(P, "_poison_allocator", lambda *shapes: set())
    monkeypatch.setattr(P, "ANCHOR_LIB", P.ROOT / "no-such-anchor.so")
    result = P.run_peers([2], extra, None, SCALE)
    [row] = result.rows
    assert result.available[P.SOURCE].endswith("not found (benchmarks/anchor_flashmla/build.sh builds it)")
    assert set(row.us) == {P.MMA, P.SLOT, P.SHIPPED} and all(v == pytest.approx(1.0) for v in row.us.values())
    assert all(P._within(e) for e in row.err.values()), row.err
    assert row.poisoned == {P.MMA: True, P.SLOT: True, P.SHIPPED: False}  # no bait on a CPU
    assert len(calls) == 2 + 1 + 2 and all(kw["use_legacy"] is True for kw in calls)  # fill, check, time

    right = FakeFlashMLA.flash_mla_with_kvcache

    def wrong(**kw):
        o, lse = right(**kw)
        return o, lse + 1e-3  # an lse off by 1e-3 is off by more than 1e-5 relative

    monkeypatch.setattr(FakeFlashMLA, "flash_mla_with_kvcache", staticmethod(wrong))
    [row] = P.run_peers([2], extra, None, SCALE).rows
    assert P.SHIPPED not in row.us and not P._within(row.err[P.SHIPPED])
