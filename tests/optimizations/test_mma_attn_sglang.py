"""The SGLang drop-ins (mma_attn/sglang_entry.py) against the float64 reference and against SGLang's
own Triton function, on tensors built as SGLang's DeepSeek-V4 backend builds them (sglang_contract.py:
pools, page sizes 256 / 64 / 2, views, -1 padded index rows). fp16 queries under the interpreter (it
cannot multiply bf16 in tl.dot); outputs bf16 as SGLang's; torch.empty NaN-poisoned
(tests/conftest.py).

SGLang's function runs here from its file in the PyPI wheel of each version (tests/sglang/wheels.py:
`pip download --no-deps sglang==X`, skipped when that cannot be had): the package's __init__ needs
server dependencies a CPU test does not have, the kernel module only torch and Triton. How SGLang's
own dispatchers and the backend's calls reach the drop-ins: tests/sglang/test_sglang_wheels.py.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest
import torch

from dsv4opt.numerics import error_report
from dsv4opt.optimizations.mma_attn import kernel
from dsv4opt.optimizations.mma_attn import sglang_contract as C
from dsv4opt.optimizations.mma_attn import sglang_entry as E
from dsv4opt.optimizations.mma_attn.sglang_entry import DropInInputError, flash_mla_sparse_decode_triton
from dsv4opt.workload.attention import sparse_attention_ref
from dsv4opt.workload.kvcache import KVCache
from tests.helpers import needs_gpu

INTERPRETED = type(kernel._mma_sparse_decode_kernel).__name__ == "InterpretedFunction"
on_cpu = pytest.mark.skipif(not INTERPRETED, reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")
TOL = {"o": 1e-2, "lse": 1e-5}  # relative: o is rounded to bf16 once, lse stays fp32
SCALE = C.DIM**-0.5


@dataclass(frozen=True)
class Case:
    """One layer's call: B queries, H heads, the window cache and a compressed cache of `ratio`
    (0: a window-only layer), the pattern of unused slots."""

    name: str
    batch: int = 3
    heads: int = 8
    ratio: int = 4  # 0, 4 (C4) or 128 (C128)
    topk: int = 100  # CSA layers select 512 (the GPU table); fewer keeps the interpreter quick
    pattern: str = "mixed"  # mixed | empty | all
    sink: bool = True
    lengths: bool = True  # False: topk_length None (every slot counts)


# Each call takes a few seconds in the interpreter: few rows, each covering several things at once.
CASES = [
    Case("csa-c4-mixed", batch=5),  # B > 4: the kernel's whole-width tiles
    Case("hca-c128-mixed", batch=2, ratio=128, topk=37),  # B <= 4: its value-split tiles
    Case("window-only-b1-64-heads", batch=1, heads=64, ratio=0),
    Case("empty-requests", pattern="empty", heads=4),
    Case("no-sink-empty-requests", pattern="empty", heads=4, sink=False),
    Case("no-lengths", batch=2, heads=4, lengths=False, topk=70),
]


@dataclass
class Call:
    """SGLang's arguments, plus what the reference needs to read the same bytes."""

    kwargs: dict
    caches: list  # [(KVCache over the pool, indices [B, K], lengths [B])]
    q: torch.Tensor  # [B, H, D] as given (fp16)
    sink: torch.Tensor | None


def _pool(tokens: int, page_size: int, gen) -> KVCache:
    """A pool as SGLang allocates it, every token written with a random row in its layout."""
    cache = KVCache(C.layout(page_size), C.pool_buffer(tokens, page_size))
    cache.write(torch.arange(cache.tokens), torch.randn(cache.tokens, C.DIM, generator=gen))
    return cache


def _selection(B: int, width: int, pool_tokens: int, pattern: str, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, width] distinct token numbers with -1 holes, and [B] lengths, some past the used slots."""
    idx = torch.stack([torch.randperm(pool_tokens, generator=gen)[:width] for _ in range(B)]).to(torch.int32)
    lengths = torch.randint(1, width + 1, (B,), generator=gen, dtype=torch.int32)
    if pattern == "mixed":
        idx[torch.rand(B, width, generator=gen) < 0.3] = -1
        lengths[0] = width + 5  # above K: SGLang reads K slots
    elif pattern == "empty":
        idx[0] = -1  # request 0: every slot -1
        lengths[-1] = 0  # last request: nothing counts
    return idx, lengths


def build_call(case: Case, seed: int = 0) -> Call:
    gen = torch.Generator().manual_seed(seed)
    B, H = case.batch, case.heads
    q = torch.randn(B, H, C.DIM, generator=gen).to(torch.bfloat16).to(torch.float16)  # exact in both
    sink = torch.randn(H, generator=gen) if case.sink else None
    window = _pool(B * 2 * C.SWA_WINDOW, C.KV_PAGE, gen)
    w_idx, w_len = _selection(B, C.SWA_WINDOW, window.tokens, case.pattern, gen)
    caches = [(window, w_idx, w_len)]
    kwargs = dict(
        q=q.unsqueeze(1), k_cache=C.caller_k_cache(window.data, C.KV_PAGE), indices=C.pad_indices(w_idx),
        topk_length=w_len if case.lengths else None, attn_sink=sink, head_dim_v=C.DIM, softmax_scale=SCALE,
    )
    if case.ratio:
        page = C.KV_PAGE // case.ratio
        extra = _pool(max(4 * case.topk, 3 * page), page, gen)
        e_idx, e_len = _selection(B, case.topk, extra.tokens, case.pattern, gen)
        caches.append((extra, e_idx, e_len))
        kwargs.update(extra_k_cache=C.caller_k_cache(extra.data, page), extra_indices=C.pad_indices(e_idx),
                      extra_topk_length=e_len if case.lengths else None)
    if not case.lengths:
        caches = [(c, idx, torch.full_like(lens, idx.shape[1])) for c, idx, lens in caches]
    return Call(kwargs, caches, q, sink)


def reference(call: Call) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (out [B, 1, H, D], lse [B, H, 1]); without a sink: -inf lse and 0 out where nothing is used."""
    (w, w_idx, w_len), *extra = call.caches
    e, e_idx, e_len = extra[0] if extra else (None, None, None)
    H = call.q.shape[1]
    sink = call.sink if call.sink is not None else torch.full((H,), float("-inf"))
    o, lse = sparse_attention_ref(call.q, w, w_idx, w_len, e, e_idx, e_len, sink, SCALE)
    o = torch.nan_to_num(o, nan=0.0)  # no sink and nothing used: 0 / 0
    return o.unsqueeze(1), lse.unsqueeze(2)


def assert_close(out, lse, ref_o, ref_lse):
    assert out.shape == ref_o.shape and lse.shape == ref_lse.shape
    assert error_report(out, ref_o).ok(TOL["o"]), error_report(out, ref_o)
    assert error_report(lse, ref_lse).ok(TOL["lse"]), error_report(lse, ref_lse)
    assert torch.equal(torch.isneginf(lse).cpu(), torch.isneginf(ref_lse).cpu())  # error_report skips -inf references


@on_cpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_drop_in_matches_reference_on_sglangs_tensors(case):
    call = build_call(case, seed=1)
    out, lse = flash_mla_sparse_decode_triton(**call.kwargs)
    B, H = call.q.shape[:2]
    # SGLang's result: bf16 [B, 1, H, D] and the [B, H, 1] permuted view of a [B, 1, H] fp32 tensor
    assert out.dtype == torch.bfloat16 and out.shape == (B, 1, H, C.DIM) and out.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == (B, H, 1) and lse.stride() == (H, 1, H)
    assert_close(out, lse, *reference(call))
    if case.pattern == "empty":  # request 0 has only -1 slots in both caches: 0, and the sink's lse
        assert torch.all(out[0] == 0)
        expected = call.sink if case.sink else torch.full((H,), float("-inf"))
        torch.testing.assert_close(lse[0, :, 0], expected, rtol=1e-6, atol=1e-6)


@on_cpu
def test_padded_heads_of_garbage_leave_the_real_heads_alone():
    # Under attention TP the caller pads q to 64 heads with new_empty (deepseek_v4.py:914-926) and
    # slices the real ones back out: NaN in the padding must not reach them.
    call = build_call(Case("tp-padded", batch=2, heads=16, ratio=0), seed=10)
    real = 6
    call.kwargs["q"][:, :, real:] = float("nan")
    call.kwargs["attn_sink"][real:] = 0.0
    out, lse = flash_mla_sparse_decode_triton(**call.kwargs)
    ref_o, ref_lse = reference(call)
    assert_close(out[:, :, :real], lse[:, :real], ref_o[:, :, :real], ref_lse[:, :real])


@on_cpu
def test_extra_indices_without_extra_cache_are_ignored():
    # SGLang reads the compressed cache only when both the cache and its indices are given (:355)
    call = build_call(Case("c4", batch=2, heads=4, topk=64), seed=3)
    window_only = dict(call.kwargs, extra_k_cache=None)
    out, lse = flash_mla_sparse_decode_triton(**window_only)
    call.caches = call.caches[:1]
    assert_close(out, lse, *reference(call))


@on_cpu
def test_another_page_stride_is_copied_into_the_layout():
    # a pool with pages further apart than SGLang's: same records, read through a copy
    call = build_call(Case("window", batch=2, heads=4, ratio=0), seed=4)
    k = call.kwargs["k_cache"]
    pages, page = k.shape[0], k.shape[1]
    wide = torch.zeros(pages, C.page_bytes(page) + 576, dtype=torch.uint8)
    wide[:, : C.page_bytes(page)] = k.view(torch.uint8).as_strided((pages, k.stride(0)), (k.stride(0), 1))
    spread = wide.view(torch.float8_e4m3fn)[:, : page * C.TOKEN_BYTES].view(pages, page, 1, C.TOKEN_BYTES)
    out, lse = flash_mla_sparse_decode_triton(**dict(call.kwargs, k_cache=spread))
    assert_close(out, lse, *reference(call))


@on_cpu
def test_int64_indices_and_uint8_cache_are_taken():
    call = build_call(Case("window", batch=2, heads=4, ratio=0), seed=5)
    kw = dict(call.kwargs, indices=call.kwargs["indices"].long(), k_cache=call.kwargs["k_cache"].view(torch.uint8))
    out, lse = flash_mla_sparse_decode_triton(**kw)
    assert_close(out, lse, *reference(call))


@on_cpu
def test_comparison_fails_when_scales_are_read_from_the_wrong_place():
    # The test can fail: shift the window pool's scale records by one token and the result moves.
    call = build_call(Case("window", batch=2, heads=4, ratio=0), seed=6)
    ref = reference(call)
    buf = call.caches[0][0].data
    at = C.KV_PAGE * 576
    buf[:, at + 8 : at + C.KV_PAGE * 8] = buf[:, at : at + (C.KV_PAGE - 1) * 8].clone()
    out, lse = flash_mla_sparse_decode_triton(**call.kwargs)
    assert not error_report(out, ref[0]).ok(TOL["o"])


def _params(fn) -> list[tuple]:
    return [(p.name, C.REQUIRED if p.default is inspect.Parameter.empty else p.default,
             p.kind is inspect.Parameter.KEYWORD_ONLY) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("fn, contract", [
    (flash_mla_sparse_decode_triton, C.ENTRY_PARAMETERS),
    (E.flash_mla_flashinfer, C.FLASHINFER_PARAMETERS),
    (E.flash_mla_with_kvcache, C.FLASHMLA_PARAMETERS),
], ids=["triton-entry", "flashinfer", "flashmla"])
def test_signatures_are_the_contracts(fn, contract):
    # the contracts themselves are held against each wheel's functions in tests/sglang/test_sglang_wheels.py
    kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
    assert kinds <= {inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY}
    assert _params(fn) == [tuple(p) for p in contract]


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(q=torch.zeros(2, 2, 8, 512)), r"q must be \[B, 1, H, 512\]"),
        (dict(q=torch.zeros(2, 1, 8, 576)), r"q must be"),
        (dict(k_cache=torch.zeros(3, 256, 1, 576, dtype=torch.uint8)), "k_cache must be"),
        (dict(k_cache=torch.zeros(3, 256, 1, 584, dtype=torch.bfloat16)), "float8_e4m3fn or uint8"),
        (dict(attn_sink=torch.zeros(5)), "5 values for 8 heads"),
        (dict(indices=torch.zeros(3, 1, 64, dtype=torch.int32)), "3 rows for 2 queries"),
    ],
    ids=["two-queries-per-request", "wide-q", "no-scale-bytes", "bf16-cache", "sink-heads", "index-rows"],
)
def test_inputs_sglang_could_not_take_are_refused(change, message):
    call = build_call(Case("w", ratio=0, batch=2), seed=7)
    with pytest.raises(DropInInputError, match=message):
        flash_mla_sparse_decode_triton(**dict(call.kwargs, **change))


# --- SGLang 0.5.23's other two slots: FlashInfer's on sm_120, FlashMLA's on Hopper ----------------

def flashinfer_args(call: Call) -> tuple:
    """`_flash_mla_flashinfer`'s ten arguments, positional, as flash_mla_sm120.py:330-341 passes them."""
    kw = call.kwargs
    return tuple(kw.get(name) for name in ("q", "k_cache", "indices", "topk_length", "attn_sink", "head_dim_v",
                                           "softmax_scale", "extra_k_cache", "extra_indices", "extra_topk_length"))


def backend_flashmla_kwargs(call: Call, meta=None) -> dict:
    """The keywords deepseek_v4_backend.py:4384-4399 passes (C.FLASHMLA_CALL_KEYWORDS), plus the
    partial's use_legacy=True (:1268-1271)."""
    kw = call.kwargs
    return dict(q=kw["q"], k_cache=kw["k_cache"], head_dim_v=C.DIM, block_table=None, cache_seqlens=None,
                tile_scheduler_metadata=meta if meta is not None else object(), softmax_scale=kw["softmax_scale"],
                is_fp8_kvcache=True, indices=kw["indices"], topk_length=kw["topk_length"], attn_sink=kw["attn_sink"],
                extra_k_cache=kw.get("extra_k_cache"), extra_indices_in_kvcache=kw.get("extra_indices"),
                extra_topk_length=kw.get("extra_topk_length"), use_legacy=True)


def reference_flashmla_lse(call: Call) -> torch.Tensor:
    """float64 [B, H, 1]: FlashMLA's lse, the scores' log-sum-exp without the sink, +inf where nothing
    is used (its tests/ref.py, ref_sparse_attn_decode)."""
    (w, w_idx, w_len), *extra = call.caches
    e, e_idx, e_len = extra[0] if extra else (None, None, None)
    H = call.q.shape[1]
    _, lse = sparse_attention_ref(call.q, w, w_idx, w_len, e, e_idx, e_len, torch.full((H,), float("-inf")), SCALE)
    return torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse).unsqueeze(2)


def assert_flashmla_lse(lse, ref):
    assert lse.dtype == torch.float32 and lse.shape == ref.shape
    assert torch.equal(torch.isposinf(lse).cpu(), torch.isposinf(ref).cpu())  # error_report skips them
    assert error_report(lse, ref).ok(TOL["lse"]), error_report(lse, ref)


@on_cpu
@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[5]], ids=lambda c: c.name)
def test_flashinfer_slot_matches_reference(case):
    call = build_call(case, seed=12)
    out, lse = E.flash_mla_flashinfer(*flashinfer_args(call))
    B, H = call.q.shape[:2]
    assert lse is None and out.dtype == torch.bfloat16 and out.shape == (B, 1, H, C.DIM)
    ref_o, _ = reference(call)
    assert error_report(out, ref_o).ok(TOL["o"]), error_report(out, ref_o)


@on_cpu
def test_flashinfer_slot_takes_three_dimensional_q_and_index_rows():
    # _flash_mla_flashinfer squeezes q and indices only when they have the extra axis (:613, :659)
    call = build_call(Case("w", batch=2, heads=4, ratio=4, topk=64), seed=13)
    args = list(flashinfer_args(call))
    args[0], args[2], args[8] = args[0].squeeze(1), args[2].squeeze(1), args[8].squeeze(1)
    out, _ = E.flash_mla_flashinfer(*args)
    assert error_report(out, reference(call)[0]).ok(TOL["o"])


def test_flashinfer_slot_refuses_another_value_width():
    call = build_call(Case("w", ratio=0, batch=2), seed=14)
    args = list(flashinfer_args(call))
    args[5] = 448
    with pytest.raises(DropInInputError, match="head_dim_v must be 512"):
        E.flash_mla_flashinfer(*args)


@on_cpu
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[2], CASES[3], CASES[4]], ids=lambda c: c.name)
def test_flashmla_slot_returns_flashmlas_result(case):
    call = build_call(case, seed=15)
    meta = type("FlashMLASchedMeta", (), {"have_initialized": False})()
    out, lse = E.flash_mla_with_kvcache(**backend_flashmla_kwargs(call, meta))
    B, H = call.q.shape[:2]
    assert out.dtype == torch.bfloat16 and out.shape == (B, 1, H, C.DIM)
    assert error_report(out, reference(call)[0]).ok(TOL["o"]), error_report(out, reference(call)[0])
    assert_flashmla_lse(lse, reference_flashmla_lse(call))
    assert meta.have_initialized is False  # FlashMLA's schedule is left as it came


@on_cpu
def test_flashmla_slot_comparison_fails_when_the_sink_stays_in_the_lse():
    # The lse check can fail: mma-attn's own lse (the sink in it) is not FlashMLA's.
    call = build_call(Case("csa", batch=3, heads=8), seed=16)
    _, with_sink = flash_mla_sparse_decode_triton(**call.kwargs)
    with pytest.raises(AssertionError):
        assert_flashmla_lse(with_sink, reference_flashmla_lse(call))



@on_cpu
def test_flashmla_slot_lse_holds_where_the_sink_outweighs_every_score():
    # A sink 40 above the scores: the lse with the sink is the sink to fp32's last bit, so no
    # conversion after the kernel can get the scores' lse back from it (the old one gave -41.9 for
    # 5.5); the kernel writes it from its own running sums. Empty requests +inf as ever.
    call = build_call(Case("empty-big-sink", pattern="empty", heads=4), seed=17)
    big = torch.full_like(call.sink, 40.0)
    call = Call(dict(call.kwargs, attn_sink=big), call.caches, call.q, big)
    out, lse = E.flash_mla_with_kvcache(**backend_flashmla_kwargs(call))
    ref = reference_flashmla_lse(call)
    assert torch.isposinf(ref).any() and torch.isfinite(ref).any()
    assert_flashmla_lse(lse, ref)
    assert error_report(out, reference(call)[0]).max_abs < 1e-6  # scaled by ~e^-37: zero in bf16


def test_flashmla_slot_is_one_kernel_call_asking_for_flashmlas_lse(monkeypatch):
    """The Hopper slot calls mma_attention once with lse_with_sink=False and returns its lse as it
    came (a view, nothing launched after the kernel); the other slots keep the sink in."""
    call = build_call(Case("w", batch=2, heads=4, ratio=4, topk=64), seed=18)
    calls = []

    def recorder(q, *args, lse_with_sink=True, **kw):
        B, H, D = q.shape
        calls.append(lse_with_sink)
        return torch.zeros(B, H, D, dtype=torch.bfloat16), torch.arange(B * H, dtype=torch.float32).reshape(B, H)

    monkeypatch.setattr(kernel, "mma_attention", recorder)
    _, lse = E.flash_mla_with_kvcache(**backend_flashmla_kwargs(call))
    assert calls == [False] and lse.shape == (2, 4, 1)
    assert torch.equal(lse[..., 0], torch.arange(8, dtype=torch.float32).reshape(2, 4))
    flash_mla_sparse_decode_triton(**call.kwargs)
    E.flash_mla_flashinfer(*flashinfer_args(call))
    assert calls == [False, True, True]

@pytest.mark.parametrize("change", [
    dict(indices=None), dict(causal=True), dict(is_fp8_kvcache=False), dict(kv_format="V32_NO_ROPE"),
    dict(use_legacy=False), dict(head_dim_v=448), dict(q_rows=2), dict(k_bytes=528),
], ids=["dense", "causal", "not-fp8", "kv-format", "current-kernels", "value-width", "two-queries", "v41-cache"])
def test_flashmla_slot_hands_other_calls_to_sglangs_own(change, monkeypatch):
    call = build_call(Case("w", ratio=0, batch=2, heads=4), seed=17)
    kw = backend_flashmla_kwargs(call)
    if "q_rows" in change:
        kw["q"] = kw["q"].expand(-1, change.pop("q_rows"), -1, -1)
    if "k_bytes" in change:
        kw["k_cache"] = torch.zeros(2, 64, 1, change.pop("k_bytes"), dtype=torch.uint8)
    kw.update(change)
    seen = []
    monkeypatch.setattr(E, "_fallback", {})
    E.set_fallback(C.FLASHMLA_NAME, lambda **k: seen.append(k) or "sglang's")
    assert E.flash_mla_with_kvcache(**kw) == "sglang's"
    assert seen and seen[0].keys() == {p.name for p in C.FLASHMLA_PARAMETERS}
    monkeypatch.setattr(E, "_fallback", {})
    with pytest.raises(DropInInputError, match="not a DeepSeek-V4 sparse FP8 decode call"):
        E.flash_mla_with_kvcache(**kw)


def test_set_fallback_keeps_sglangs_function_not_ours(monkeypatch):
    monkeypatch.setattr(E, "_fallback", {})
    E.set_fallback(C.FLASHMLA_NAME, E.flash_mla_with_kvcache)  # a second install finds ours there
    assert E._fallback == {}

    def sglangs(**_):
        return None

    E.set_fallback(C.FLASHMLA_NAME, sglangs)
    E.set_fallback(C.FLASHMLA_NAME, lambda **_: None)
    assert E._fallback[C.FLASHMLA_NAME] is sglangs


def _independent_rows(buffer: torch.Tensor, page_size: int, tokens: torch.Tensor) -> torch.Tensor:
    """Rows decoded straight from the bytes, as flash_mla_sm120.py:_gather_and_dequant describes the
    page (data records of 576 B, then 8-byte scale records at page_size * 576), not through KVCache."""
    pages = buffer.view(torch.uint8)
    out = []
    for t in tokens.tolist():
        page = pages[t // page_size]
        rec = page[(t % page_size) * 576 : (t % page_size + 1) * 576]
        scales = page[page_size * 576 + (t % page_size) * 8 :][:7].double()
        nope = rec[:448].view(torch.float8_e4m3fn).double().view(7, 64) * torch.exp2(scales - 127)[:, None]
        out.append(torch.cat([nope.reshape(-1), rec[448:].clone().view(torch.bfloat16).double()]))
    return torch.stack(out)


@pytest.mark.parametrize("page_size", [C.KV_PAGE, C.KV_PAGE // 4, C.KV_PAGE // 128], ids=["window", "c4", "c128"])
def test_our_fp8_layout_is_sglangs_page(page_size):
    gen = torch.Generator().manual_seed(8)
    cache = _pool(3 * page_size, page_size, gen)
    assert cache.data.shape[1] == C.page_bytes(page_size) == cache.layout.page_bytes
    tokens = torch.tensor([0, 1, page_size - 1, page_size, cache.tokens - 1])
    assert torch.equal(cache.read(tokens), _independent_rows(cache.data, page_size, tokens))


# --- against SGLang's own function, from each version's wheel ------------------------------------

# Where each version keeps the Triton entry (0.5.23 moved it; the file is otherwise the same).
TRITON_FILES = {C.SGLANG_VERSION: C.ENTRY_MODULE, C.SGLANG_023: C.TRITON_MODULE_023}


def _sglang_kernel_module(version: str = C.SGLANG_VERSION):
    """SGLang's flash_mla_sm120_triton module of `version`, loaded from its file in the wheel under a
    private name (it imports only torch and Triton); skips when the wheel cannot be had."""
    import importlib.util

    from tests.sglang.wheels import WheelModules, wheel

    whl = wheel("sglang", version)
    w = WheelModules(whl, "sglang")
    path = w.extract(TRITON_FILES[version].replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location(f"sglang_{version.replace('.', '_')}_flash_mla_sm120_triton", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Its autotuner benchmarks on a GPU; with one config left it runs that config, no benchmark.
    module._tiled_sparse_decode_kernel.configs = module._tiled_sparse_decode_kernel.configs[:1]
    return module


@pytest.mark.parametrize("version", list(TRITON_FILES))
def test_signature_matches_sglangs(version):
    module = _sglang_kernel_module(version)
    theirs = inspect.signature(getattr(module, C.ENTRY_NAME)).parameters.values()
    ours = inspect.signature(flash_mla_sparse_decode_triton).parameters.values()
    assert [(p.name, p.kind, p.default) for p in theirs] == [(p.name, p.kind, p.default) for p in ours]


# Smaller than CASES: SGLang's kernel runs one interpreted program per (request, head).
SGLANG_CASES = [
    Case("csa-c4-mixed", batch=2, heads=4, topk=64),
    Case("hca-c128-no-sink-empty-requests", batch=3, heads=4, ratio=128, topk=37, pattern="empty", sink=False),
]


@on_cpu
@pytest.mark.parametrize("case", SGLANG_CASES, ids=lambda c: c.name)
def test_drop_in_matches_sglangs_own_function(case):
    module = _sglang_kernel_module(C.SGLANG_VERSION)
    call = build_call(case, seed=9)
    theirs = getattr(module, C.ENTRY_NAME)(**dict(call.kwargs, q=call.kwargs["q"].to(torch.bfloat16)))
    ours = flash_mla_sparse_decode_triton(**call.kwargs)
    ref_o, ref_lse = reference(call)
    for out, lse in (theirs, ours):  # SGLang's function meets the same reference: the contract holds
        assert out.dtype == torch.bfloat16 and lse.shape == ref_lse.shape and lse.stride() == ours[1].stride()
        assert_close(out, lse, ref_o, ref_lse)
    assert error_report(ours[0], theirs[0]).ok(TOL["o"])


def on_device(call: Call, device: str, dtype: torch.dtype) -> dict:
    """The call's arguments on `device`, the pools moved whole and viewed again as the backend does."""
    kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in call.kwargs.items()}
    kw["q"] = kw["q"].to(dtype)
    for key, (cache, _, _) in zip(("k_cache", "extra_k_cache"), call.caches):
        kw[key] = C.caller_k_cache(cache.data.to(device), cache.layout.page_size)
    return kw


@needs_gpu
@pytest.mark.parametrize("case", CASES + [Case("flash-b64-h64-k512", batch=64, heads=64, topk=512)], ids=lambda c: c.name)
def test_drop_in_on_gpu_in_bf16(case):
    call = build_call(case, seed=11)
    out, lse = flash_mla_sparse_decode_triton(**on_device(call, "cuda", torch.bfloat16))
    assert_close(out, lse, *reference(call))
    try:
        theirs = getattr(_sglang_kernel_module(), C.ENTRY_NAME)
    except pytest.skip.Exception:
        return
    t_out, t_lse = theirs(**on_device(call, "cuda", torch.bfloat16))
    assert_close(t_out, t_lse, *reference(call))
    assert error_report(out, t_out).ok(TOL["o"])


# SGLang 0.5.23's two new slots on the GPU in bf16; the Hopper one also beside the FlashMLA SGLang
# 0.5.23 ships (sgl-flash-mla 1.0.0), called with the same arguments, when flash_mla imports: its
# result is the contract the drop-in keeps (lse without the sink, +inf where nothing is used).
GPU_023 = [c for c in CASES if c.heads == 64 or c.pattern == "empty"] + [
    Case("flash-b64-h64-k512", batch=64, heads=64, topk=512),
    Case("hca-b32-h64-empty", batch=32, heads=64, ratio=128, topk=64, pattern="empty"),
]


@needs_gpu
@pytest.mark.parametrize("case", GPU_023, ids=lambda c: c.name)
def test_0_5_23_slots_on_gpu_in_bf16(case):
    call = build_call(case, seed=18)
    kw = on_device(call, "cuda", torch.bfloat16)
    ref_o = reference(call)[0]
    out, none = E.flash_mla_flashinfer(*(kw.get(n) for n in ("q", "k_cache", "indices", "topk_length", "attn_sink",
                                                            "head_dim_v", "softmax_scale", "extra_k_cache",
                                                            "extra_indices", "extra_topk_length")))
    assert none is None and error_report(out, ref_o).ok(TOL["o"]), error_report(out, ref_o)
    hopper = backend_flashmla_kwargs(Call(kw, call.caches, call.q, call.sink))
    out, lse = E.flash_mla_with_kvcache(**hopper)
    assert error_report(out, ref_o).ok(TOL["o"]), error_report(out, ref_o)
    assert_flashmla_lse(lse, reference_flashmla_lse(call))
    try:
        import flash_mla
    except Exception:  # not installed (or no extension here): the reference above is the contract
        return
    if case.heads not in (64, 128) or case.sink is False:
        return  # FlashMLA takes 64 or 128 heads; SGLang always passes a sink
    shipped = dict(hopper, tile_scheduler_metadata=flash_mla.get_mla_metadata()[0])
    for lengths, rows in (("topk_length", "indices"), ("extra_topk_length", "extra_indices_in_kvcache")):
        if shipped[lengths] is not None:  # FlashMLA reads `length` index slots: SGLang's never exceed K
            shipped[lengths] = shipped[lengths].clamp(max=shipped[rows].shape[-1])
    s_out, s_lse = flash_mla.flash_mla_with_kvcache(**shipped, causal=False, kv_format=None)
    assert error_report(s_out, ref_o).ok(TOL["o"]), error_report(s_out, ref_o)
    assert_flashmla_lse(s_lse, reference_flashmla_lse(call))
