"""mma-attn beside FlashMLA, in one run on the same inputs: `dsv4opt bench mma-attn` (FP8 cache).

Four callables, each on the rotating input sets the main bench times (bench_inputs.py), over the
same 4 GB pool:

- "mma-attn": the kernel (`mma_attention`), as the main table times it;
- "mma-attn slot": the drop-in in SGLang 0.5.23's Hopper slot (`sglang_entry.flash_mla_with_kvcache`),
  called with the keywords the DeepSeek-V4 backend passes (deepseek_v4_backend.py:4384-4399), so its
  views are in the time, and its FlashMLA-convention lse comes from the kernel's own launches
  (`mma_attention(..., lse_with_sink=False)`), no launch after them;
- "FlashMLA 1.0.0": FlashMLA as SGLang 0.5.23 ships it, the `sgl-flash-mla==1.0.0` wheel, called as
  SGLang's wrapper calls it (`flash_mla_kwargs`: sglang/kernels/ops/attention/flash_mla_interface.py:
  121-141, with the backend's arguments and the partial's use_legacy=True); its scheduler metadata is
  filled by the first call on each input set, outside the timed calls, as SGLang fills it by the first
  layer of a step and reuses it in the others. Timed when `flash_mla` imports;
- "FlashMLA source": FlashMLA built from source (the anchor of issue 13, anchor.py), when its library
  is present (DSV4OPT_FLASHMLA_ANCHOR, default .anchor/libflashmla_anchor.so in the checkout;
  benchmarks/anchor_flashmla/build.sh builds it).

Each is checked against the float64 reference on the first input set before it is timed, its outputs
NaN-poisoned: ours through torch.empty (numerics.nan_poisoned_allocations), the anchor's buffers by
filling, and FlashMLA 1.0.0's by NaN-filled blocks of its output sizes freed just before the call,
which CUDA's caching allocator hands back (`poisoned` says whether both outputs landed in them). A
callable off the reference by more than PEER_TOL in o or PEER_TOL_LSE in lse is not timed. Nothing
here asserts a speed.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from dsv4opt.optimizations import timing
from dsv4opt.optimizations.mma_attn import anchor
from dsv4opt.optimizations.mma_attn import bench_inputs as inputs
from dsv4opt.optimizations.mma_attn import sglang_contract as C

# Relative: largest error over the largest reference magnitude. lse is fp32 in every kernel (the
# anchor's were within 2e-7); at 5e-3 an lse with the sink left in would pass, over 640 used slots.
PEER_TOL = 5e-3  # o
PEER_TOL_LSE = 1e-5
ROOT = Path(__file__).resolve().parents[3]
ANCHOR_LIB = Path(os.environ.get("DSV4OPT_FLASHMLA_ANCHOR", ROOT / ".anchor" / "libflashmla_anchor.so"))
MMA, SLOT, SHIPPED, SOURCE = "mma-attn", "mma-attn slot", "FlashMLA 1.0.0", "FlashMLA source"
# The targets for the Hopper slot against the shipped FlashMLA, reported, never asserted.
TARGETS = {64: 1.3, 32: 1.1}


@dataclass(frozen=True)
class PeerRow:
    batch: int
    input_sets: int
    err: dict[str, tuple[float, float]]  # callable -> relative error of (o, lse) on the first set
    poisoned: dict[str, bool]  # callable -> its outputs were NaN before the checked call
    us: dict[str, float]  # callable -> median µs per call; only those within PEER_TOL


@dataclass
class PeerResult:
    available: dict[str, str]  # callable -> "yes" or why it did not run
    rows: list[PeerRow] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"tolerance": {"o": PEER_TOL, "lse": PEER_TOL_LSE}, "targets_slot_x_shipped": TARGETS, "available": self.available,
                "rows": [asdict(r) for r in self.rows]}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest absolute error over the largest reference magnitude, over the reference's finite
    elements; a NaN, or a non-finite value where the reference is finite, is infinite."""
    got, want = got.double().cpu(), want.double().cpu()
    finite = torch.isfinite(want)
    if torch.isnan(got).any() or not torch.isfinite(got[finite]).all() or not torch.equal(
            got[~finite], want[~finite]):
        return float("inf")
    if not finite.any():
        return 0.0
    return float((got[finite] - want[finite]).abs().max() / want[finite].abs().max().clamp(min=1e-30))


def reference(inputs: tuple, swa, extra, scale: float):
    """float64 (o with the sink, lse with it, lse without it; +inf where nothing is used, FlashMLA's)."""
    from dsv4opt.workload.attention import sparse_attention_ref

    q, swa_idx, swa_len, idx, lengths, sink = inputs
    o, lse = sparse_attention_ref(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale)
    _, bare = sparse_attention_ref(q, swa, swa_idx, swa_len, extra, idx, lengths, torch.full_like(sink, float("-inf")), scale)
    return o, lse, torch.where(torch.isneginf(bare), torch.full_like(bare, float("inf")), bare)


def backend_kwargs(inputs: tuple, swa, extra, scale: float, meta) -> dict:
    """What SGLang 0.5.23's DeepSeek-V4 backend passes `flash_mla_with_kvcache` for one decode layer
    (deepseek_v4_backend.py:4384-4399; C.FLASHMLA_CALL_KEYWORDS): the pools as [pages, page, 1, 584]
    e4m3 views, q and the index rows with the one-query axis."""
    q, swa_idx, swa_len, idx, lengths, sink = inputs
    return dict(
        q=q.unsqueeze(1), k_cache=C.caller_k_cache(swa.data, swa.layout.page_size), head_dim_v=C.DIM,
        block_table=None, cache_seqlens=None, tile_scheduler_metadata=meta, softmax_scale=scale,
        is_fp8_kvcache=True, indices=swa_idx.unsqueeze(1), topk_length=swa_len, attn_sink=sink.float(),
        extra_k_cache=C.caller_k_cache(extra.data, extra.layout.page_size),
        extra_indices_in_kvcache=idx.unsqueeze(1), extra_topk_length=lengths,
    )


def flash_mla_kwargs(call: dict) -> dict:
    """What SGLang 0.5.23's wrapper passes `flash_mla.flash_mla_with_kvcache` for the backend's call
    (flash_mla_interface.py:93-141, with a FlashMLASchedMeta and use_legacy=True from the partial)."""
    return dict(
        q=call["q"], k_cache=call["k_cache"], block_table=call["block_table"], cache_seqlens=call["cache_seqlens"],
        head_dim_v=call["head_dim_v"], tile_scheduler_metadata=call["tile_scheduler_metadata"],
        softmax_scale=call["softmax_scale"], causal=False, is_fp8_kvcache=call["is_fp8_kvcache"],
        indices=call["indices"], attn_sink=call["attn_sink"], extra_k_cache=call["extra_k_cache"],
        extra_indices_in_kvcache=call["extra_indices_in_kvcache"], topk_length=call["topk_length"],
        extra_topk_length=call["extra_topk_length"], use_legacy=True, kv_format=None, descale_q=None, descale_k=None,
    )


def shipped_flash_mla():
    """(the flash_mla module, "yes") when sgl-flash-mla imports here, else (None, why not)."""
    if importlib.util.find_spec("flash_mla") is None:
        return None, "flash_mla does not import here (pip install --no-deps sgl-flash-mla==1.0.0)"
    try:
        import flash_mla
    except Exception as exc:  # a wheel whose extension does not load here: say so, time the rest
        return None, f"flash_mla does not import here ({type(exc).__name__}: {exc})"
    version = getattr(flash_mla, "__version__", "?")
    return flash_mla, "yes" if version == "1.0.0" else f"yes (version {version}, not the 1.0.0 SGLang 0.5.23 pins)"


def _poison_allocator(*shapes_dtypes) -> set[int]:
    """NaN-filled blocks of these sizes, freed: the caching allocator hands them to the next
    allocations of those sizes. Returns their addresses."""
    baits = [torch.full(s, float("nan"), dtype=d, device="cuda") for s, d in shapes_dtypes for _ in range(4)]
    torch.cuda.synchronize()
    return {b.data_ptr() for b in baits}


def _check(name: str, run: Callable[[], tuple], want: tuple, row_err: dict, row_poisoned: dict,
           poisoned: bool | Callable[[tuple], bool] = True) -> bool:
    out = run()
    torch.cuda.synchronize()
    row_err[name] = (rel_err(out[0], want[0]), rel_err(out[1], want[1]))
    row_poisoned[name] = poisoned(out) if callable(poisoned) else poisoned
    return _within(row_err[name])


def _within(err: tuple[float, float]) -> bool:
    return err[0] <= PEER_TOL and err[1] <= PEER_TOL_LSE


def run_peers(batches, extra, gen: torch.Generator, scale: float,
              on_step: Callable[[str], None] = lambda _msg: None) -> PeerResult:
    """Check, then time, the four callables on each batch size's input sets (FP8 caches)."""
    from dsv4opt.numerics import nan_poisoned_allocations
    from dsv4opt.optimizations.mma_attn import sglang_entry
    from dsv4opt.optimizations.mma_attn.kernel import mma_attention

    flash_mla, shipped_why = shipped_flash_mla()
    anchor_lib, anchor_why = anchor.load(ANCHOR_LIB)
    result = PeerResult(available={MMA: "yes", SLOT: "yes", SHIPPED: shipped_why, SOURCE: anchor_why})
    for batch in batches:
        on_step(f"peers, B = {batch}")
        swa = inputs.window_cache("fp8", batch, gen)
        sets = inputs.input_sets(batch, swa, extra, gen)
        o_ref, lse_ref, bare_ref = reference(sets[0], swa, extra, scale)
        err, poisoned, us = {}, {}, {}
        q, swa_idx, swa_len, idx, lengths, sink = sets[0]

        with nan_poisoned_allocations():
            ok = _check(MMA, lambda: mma_attention(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale),
                        (o_ref, lse_ref), err, poisoned)
        if ok:
            us[MMA] = timing.median_graph_ms(inputs.rotating(mma_attention, swa, extra, sets, scale)) * 1e3

        slot_calls = [backend_kwargs(s, swa, extra, scale, meta=None) for s in sets]
        with nan_poisoned_allocations():
            ok = _check(SLOT, lambda: _squeezed(sglang_entry.flash_mla_with_kvcache(**slot_calls[0], use_legacy=True)),
                        (o_ref, bare_ref), err, poisoned)
        if ok:
            us[SLOT] = _time_cycle(lambda kw: sglang_entry.flash_mla_with_kvcache(**kw, use_legacy=True), slot_calls)

        if flash_mla is not None:
            shipped_calls = [flash_mla_kwargs(backend_kwargs(s, swa, extra, scale, flash_mla.get_mla_metadata()[0]))
                             for s in sets]
            for kw in shipped_calls:  # each set's schedule, filled by its first call, outside the timing
                flash_mla.flash_mla_with_kvcache(**kw)
            baits = _poison_allocator(((batch, 1, inputs.HEADS, C.DIM), torch.bfloat16), ((batch, inputs.HEADS, 1), torch.float32))
            ok = _check(SHIPPED, lambda: _squeezed(flash_mla.flash_mla_with_kvcache(**shipped_calls[0])),
                        (o_ref, bare_ref), err, poisoned,
                        poisoned=lambda out: {out[0].data_ptr(), out[1].data_ptr()} <= baits)
            if ok:
                us[SHIPPED] = _time_cycle(lambda kw: flash_mla.flash_mla_with_kvcache(**kw), shipped_calls)

        if anchor_lib is not None:
            fm = anchor.FlashMLA(anchor_lib, batch, swa, extra, sets, scale)
            fm.out.fill_(float("nan"))
            fm.lse.fill_(float("nan"))
            ok = _check(SOURCE, lambda: fm.call(0), (o_ref, bare_ref), err, poisoned)
            if ok:
                us[SOURCE] = timing.median_graph_ms(lambda: fm.call()) * 1e3
        result.rows.append(PeerRow(batch, len(sets), err, poisoned, us))
    return result


def _squeezed(out: tuple) -> tuple:
    """FlashMLA's (out [B, 1, H, D], lse [B, H, 1]) as the reference's [B, H, D] and [B, H]."""
    return out[0].squeeze(1), out[1].squeeze(-1)


def _time_cycle(fn: Callable[[dict], object], calls: list[dict]) -> float:
    """Median µs of fn over the calls in turn, replayed as a CUDA graph."""
    cycle = itertools.cycle(calls)
    return timing.median_graph_ms(lambda: fn(next(cycle))) * 1e3


def render(result: PeerResult):
    """The peers' table: µs per call and each against the shipped FlashMLA, targets under it."""
    from dsv4opt.display import narrow_table

    notes = [f"{name}: {why}" for name, why in result.available.items() if why != "yes"]
    lines = []
    for r in result.rows:
        for target_b, target in TARGETS.items():
            if r.batch == target_b and SLOT in r.us and SHIPPED in r.us:
                x = r.us[SHIPPED] / r.us[SLOT]
                lines.append(f"B = {r.batch}: slot {x:.2f}x FlashMLA 1.0.0, target {target:.1f}x: "
                             + ("met" if x >= target else "not met"))
        off = [f"{n} off by {e[0]:.1e} (o), {e[1]:.1e} (lse)" for n, e in r.err.items() if not _within(e)]
        unpoisoned = [n for n, p in r.poisoned.items() if not p]
        if off or unpoisoned:
            lines.append(f"B = {r.batch}: " + "; ".join(off + [f"{n}: outputs not NaN-poisoned" for n in unpoisoned]))
    table = narrow_table(
        f"mma-attn beside FlashMLA, same inputs (FP8 cache; checked within {PEER_TOL:g} (o) and "
        f"{PEER_TOL_LSE:g} (lse) of float64)",
        padding=0, caption="\n".join(notes + lines), caption_justify="left",
    )
    names = [MMA, SLOT, SHIPPED, SOURCE]
    for col in ("B", "mma-attn\nµs", "slot\nµs", "FlashMLA\n1.0.0 µs", "FlashMLA\nsrc µs", "x 1.0.0\n(mma)",
                "x 1.0.0\n(slot)", "x src\n(slot)"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in result.rows:
        t = [f"{r.us[n]:.1f}" if n in r.us else "-" for n in names]

        def ratio(a, b):
            return f"{r.us[b] / r.us[a]:.2f}" if a in r.us and b in r.us else "-"

        table.add_row(str(r.batch), *t, ratio(MMA, SHIPPED), ratio(SLOT, SHIPPED), ratio(SLOT, SOURCE))
    return table
