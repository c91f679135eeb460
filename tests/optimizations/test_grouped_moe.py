"""grouped-moe: the production layout, the routing, the kernels against the float64 definition over
the interpreter table (fp16: the interpreter cannot multiply bf16 in tl.dot) and every GEMM path of
the config table, a gate that fails on broken implementations, and the model built with it."""

from __future__ import annotations

import importlib
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from dsv4opt import tritonlib
from dsv4opt.errors import DsvOptError
from dsv4opt.numerics import error_report
from dsv4opt.workload.kernels.grouped_moe import kernel
from dsv4opt.workload.kernels.grouped_moe.direct import DirectTiles, direct_shape_ok
from dsv4opt.workload.kernels.grouped_moe import configs
from dsv4opt.workload.kernels.grouped_moe import layout
from dsv4opt.optimizations.grouped_moe.cases import MoeCase, interpreter_cases, make_inputs
from dsv4opt.workload import quant
from dsv4opt.workload.baseline import routed_experts_sm120
from dsv4opt.workload.kernels import naive
from dsv4opt.workload.weights import Mxfp4Experts

check_module = importlib.import_module("dsv4opt.optimizations.grouped_moe.check")
INTERPRETED = type(kernel._moe_up_kernel).__name__ == "InterpretedFunction"
on_cpu = pytest.mark.skipif(not INTERPRETED, reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")
SMALL = [MoeCase(13, p, hidden=64, width=96, experts=5, topk=3) for p in ("mixed", "one_hot_expert", "all_other_ranks")]


# --- the production layout -------------------------------------------------------------------------

@pytest.mark.parametrize("R, N, K", [(3, 32, 64), (2, 48, 160), (1, 16, 32), (2, 192, 96), (1, 4096 // 64, 128)])
def test_repack_round_trips(R, N, K):
    w = Mxfp4Experts(R, N, K, torch.Generator().manual_seed(R * N + K), "cpu")
    p = layout.repack(w.packed, w.scales)
    assert p.values.shape == (R, -(-N // 16), -(-K // 64), 512) and p.scales.shape == (R, -(-N // 16), -(-K // 64), 32)
    packed, scales = layout.unpack(p)
    assert torch.equal(packed, w.packed) and torch.equal(scales, w.scales)


def _bf16_bits_value(bits: int) -> float:
    import struct

    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def _pair_bits(word: int, j: int) -> int:
    """The kernel's decode of pair j, as documented in layout.py."""
    m = 0x81C081C0
    if j < 3:
        return (word << (3 * j)) & m & 0xFFFFFFFF
    return ((word << 1) & 0x80008000) | ((word >> 3) & 0x01800180) | ((word >> 7) & 0x00400040)


def test_a_lanes_words_decode_to_its_mma_fragment_by_the_documented_masks():
    """The layout's definition read from the docstring, decoded word by word in plain Python (the
    kernel's shifts and masks, the 2^126 bias and the e8m0 scale), against the dequantised weight."""
    gen = torch.Generator().manual_seed(3)
    w = Mxfp4Experts(1, 32, 128, gen, "cpu")
    dense = w.dense(0)
    p = layout.repack(w.packed, w.scales)
    values, scales = p.values[0], p.scales[0].to(torch.int64)
    for rb in range(2):
        for kb in range(2):
            for lane in (0, 5, 18, 31):
                g, q = lane // 4, lane % 4
                for s in range(4):
                    word = int.from_bytes(bytes(values[rb, kb, lane * 16 + s * 4: lane * 16 + s * 4 + 4].tolist()), "little")
                    for j in range(4):
                        r = _pair_bits(word, j)
                        row = rb * 16 + (j & 1) * 8 + g
                        col = kb * 64 + s * 16 + (j >> 1) * 8 + 2 * q
                        e = int(scales[rb, kb, g * 4 + (s // 2) * 2 + (j & 1)])
                        for h, bits in enumerate((r & 0xFFFF, r >> 16)):
                            got = _bf16_bits_value(bits) * 2.0**126 * 2.0 ** (e - 127)
                            assert got == dense[row, col + h].item(), (rb, kb, lane, s, j, h)


def test_scales_that_are_not_powers_of_two_are_refused():
    with pytest.raises(DsvOptError, match="powers of two"):
        layout.e8m0(torch.tensor([0.5, 0.75]))


def test_fold_is_off_past_scale_two():
    w = Mxfp4Experts(1, 16, 64, torch.Generator().manual_seed(0), "cpu")
    assert layout.repack(w.packed, w.scales).fold
    assert not layout.repack(w.packed, w.scales * 64.0).fold  # some scale reaches 4


def test_the_copy_is_built_once_and_rebuilt_when_the_weights_change():
    w = Mxfp4Experts(2, 16, 64, torch.Generator().manual_seed(0), "cpu")
    first = layout.packed_experts(w)
    assert layout.packed_experts(w) is first
    assert layout.packed_experts(Mxfp4Experts.of(w.packed, w.scales)) is first  # a new holder, the same tensors
    w.scales.mul_(2.0)  # in place: the version counter moves
    again = layout.packed_experts(w)
    assert again is not first and torch.equal(layout.unpack(again)[1], w.scales)


# --- routing ---------------------------------------------------------------------------------------

def _check_routing(r: kernel.Routing, ids: torch.Tensor, R: int, bm: int) -> None:
    """Every slot on this rank once, in a tile of its expert; tiles dense and whole; independent of
    the routing code (plain Python over the ids)."""
    flat = ids.reshape(-1).tolist()
    used = int(r.meta[0])
    rows, te, tr = r.rows.tolist(), r.tile_expert.tolist(), r.tile_rows.tolist()
    placed = []
    for t in range(used):
        tile = rows[t * bm: t * bm + tr[t]]
        assert 1 <= tr[t] <= bm and all(flat[s] == te[t] for s in tile), (t, tile, te[t])
        placed += tile
    assert sorted(placed) == [s for s, e in enumerate(flat) if e >= 0]
    counts = {e: flat.count(e) for e in set(flat) if e >= 0}
    assert used == sum(-(-c // bm) for c in counts.values()) <= r.max_tiles
    assert te[:used] == sorted(te[:used])  # each expert's tiles together, experts in order


ROUTE_SHAPES = [(37, 6, 9, 4, "mixed"), (1, 1, 1, 16, "mixed"), (13, 3, 5, 16, "all_other_ranks"),
                (40, 6, 32, 16, "one_expert"), (256, 6, 32, 16, "mixed"), (96, 6, 255, 16, "mixed"),
                (300, 6, 32, 32, "mixed"), (2000, 1, 7, 16, "mixed")]


@pytest.mark.parametrize("M, k, R, bm, pattern", ROUTE_SHAPES, ids=lambda v: str(v))
def test_route_torch_groups_every_slot(M, k, R, bm, pattern):
    ids = _ids(M, k, R, pattern)
    _check_routing(kernel.route_torch(ids, R, bm), ids, R, bm)


def _ids(M, k, R, pattern):
    gen = torch.Generator().manual_seed(M * 31 + R)
    ids = torch.randint(-1, R, (M, k), generator=gen, dtype=torch.int32)
    if pattern == "all_other_ranks":
        ids[:] = -1
    elif pattern == "one_expert":
        ids[ids >= 0] = R - 1
    return ids


@pytest.mark.skipif(not (INTERPRETED or torch.cuda.is_available()), reason="needs the interpreter or a GPU")
@pytest.mark.parametrize("M, k, R, bm, pattern", ROUTE_SHAPES, ids=lambda v: str(v))
def test_route_kernel_gives_the_torch_routings_tiles(M, k, R, bm, pattern):
    """The one-launch routing: the same tile experts and counts as route_torch, every slot placed."""
    ids = _ids(M, k, R, pattern)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    want = kernel.route_torch(ids, R, bm)
    got = kernel.route(ids.to(dev), R, bm)
    used = int(want.meta[0])
    assert int(got.meta[0]) == used
    assert torch.equal(got.tile_expert[:used].cpu(), want.tile_expert[:used])
    assert torch.equal(got.tile_rows[:used].cpu(), want.tile_rows[:used])
    _check_routing(kernel.Routing(got.rows.cpu(), got.tile_expert.cpu(), got.tile_rows.cpu(), got.meta.cpu(), bm), ids, R, bm)


def test_max_tiles_bounds_the_worst_routings():
    for S, R, bm in [(48, 32, 16), (6, 256, 16), (384, 256, 16), (3072, 32, 32), (1, 1, 16)]:
        worst = min(S, R)  # every expert used, one slot each but the last, which takes the rest
        counts = [1] * (worst - 1) + [S - (worst - 1)]
        assert sum(-(-c // bm) for c in counts) <= kernel.max_tiles(S, R, bm)


# --- kernels against the definition ----------------------------------------------------------------

@on_cpu
@pytest.mark.parametrize("case", interpreter_cases()[::2] + interpreter_cases()[-4:], ids=lambda c: c.name)
def test_kernels_and_baseline_match_the_definition(case):
    row = check_module.run_case(case, torch.device("cpu"), torch.float16, seed=2)
    assert row["passed"] and row["nonfinite"] == 0, row


_T = configs.GemmTiles(bn=64, bk=64, warps=4, stages=2)
PATHS = {
    "no-split": configs.MoeConfig(16, _T, _T),
    "up-split-3-ragged": configs.MoeConfig(16, replace(_T, split=3), _T),
    "down-split-2": configs.MoeConfig(16, _T, replace(_T, split=2)),
    "bm32-bk128-wide": configs.MoeConfig(32, replace(_T, bk=128, bn=128, split=2), replace(_T, bn=128, bk=128)),
    "one-program": configs.MoeConfig(16, replace(_T, ctas=1, split=4), replace(_T, ctas=1, split=4)),
    "flat-split": configs.MoeConfig(16, replace(_T, flat=True, split=3), replace(_T, flat=True, split=2)),
    "flat-bm32": configs.MoeConfig(32, replace(_T, flat=True, bk=128), replace(_T, flat=True, ctas=1)),
    "register-cap": configs.MoeConfig(16, replace(_T, maxnreg=128), replace(_T, maxnreg=128, flat=True)),
    "static-flat-split": configs.MoeConfig(16, replace(_T, flat=True, split=3, static=True),
                                           replace(_T, flat=True, split=2, static=True)),
    "static-nested": configs.MoeConfig(16, replace(_T, split=2, static=True), replace(_T, static=True)),
    "slotwise-split": configs.MoeConfig(16, replace(_T, split=3), replace(_T, split=2), slotwise=True),
    "slotwise-flat": configs.MoeConfig(16, replace(_T, flat=True, split=2), replace(_T, flat=True, split=3),
                                       slotwise=True),
    "slotwise-one-program": configs.MoeConfig(16, replace(_T, ctas=1), replace(_T, ctas=1), slotwise=True),
    "ws-where-gluon-cannot-run": configs.MoeConfig(16, replace(_T, ws=True), replace(_T, ws=True)),
    # the direct kernels cannot run here: the Triton row the table gives for the shape runs instead
    "direct-where-gluon-cannot-run": configs.direct_config((4, 1, 4), (4, 1, 1)),
}


@on_cpu
@pytest.mark.parametrize("path", PATHS, ids=str)
def test_every_gemm_path_matches_the_definition(path):
    """Each K split (one ticket per item, a ragged last split), the down split summed by the combine,
    wider tiles and two-step K, a register cap (the interpreter ignores it: only its launch is checked
    here; on the GPU the sweep's check and the gate hold the capped rows), slotwise tiles on fewer
    slots (every slot is an item there, run one by one by the interpreter): against float64, NaN-poisoned."""
    from dsv4opt.numerics import nan_poisoned_allocations

    case = MoeCase(17, "mixed", hidden=256, width=192, experts=6, topk=4)
    if PATHS[path].slotwise:  # ragged N blocks both ways, other ranks' slots, two tokens on expert 2
        case = MoeCase(5, "mixed", hidden=192, width=96, experts=6, topk=4)
    x = make_inputs(case, "cpu", torch.float16, seed=4)
    x.local_ids[0] = 2  # an expert with more slots than a tile
    ref = naive.routed_experts(x.x.double(), x.local_ids, x.gates.double(), x.w13, x.w2, x.limit, x.scale)
    with nan_poisoned_allocations():
        out = kernel.grouped_routed_experts(*x.args(), config=PATHS[path])
    err = error_report(out, ref)
    assert err.ok(check_module.REL_TOL), err
    assert int(kernel._tickets(torch.device("cpu"), 1).abs().sum()) == 0  # the tickets are back at 0


# --- the gate fails broken implementations ---------------------------------------------------------

def _other_ranks_on_expert_zero(x, local_ids, *rest):
    """What the per-slot kernels compute before SGLang zeroes those slots: other ranks' slots on expert 0."""
    return kernel.grouped_routed_experts(x, local_ids.clamp(min=0), *rest)


def _forgets_tokens_of_other_ranks(x, local_ids, gates, w13, w2, limit, scale):
    """Writes only the rows of tokens with a slot on this rank (the rest left as allocated)."""
    out = torch.empty_like(x)
    full = kernel.grouped_routed_experts(x, local_ids, gates, w13, w2, limit, scale)
    mine = (local_ids >= 0).any(1)
    out[mine] = full[mine]
    return out


def _with_routing(change):
    def impl(x, local_ids, gates, w13, w2, limit, scale):
        real = kernel.route

        def route(ids, experts, block_m):
            r = real(ids, experts, block_m)
            return change(r)

        kernel.route = route
        try:
            return kernel.grouped_routed_experts(x, local_ids, gates, w13, w2, limit, scale)
        finally:
            kernel.route = real

    return impl


def _drops_the_last_tile(r):
    return kernel.Routing(r.rows, r.tile_expert, r.tile_rows, r.meta - 1, r.block_m)


def _drops_a_slot(r):
    rows = r.tile_rows.clone()
    rows[0] -= 1
    return kernel.Routing(r.rows, r.tile_expert, rows, r.meta, r.block_m)


def _wrong_scale(x, local_ids, gates, w13, w2, limit, scale):
    """The down weights' e8m0 scales one too high (twice the weight)."""
    real = kernel.packed_experts

    def packed(w):
        p = real(w)
        return replace(p, scales=p.scales + 1) if w is w2 else p

    kernel.packed_experts = packed
    try:
        return kernel.grouped_routed_experts(x, local_ids, gates, w13, w2, limit, scale)
    finally:
        kernel.packed_experts = real


BROKEN = [_other_ranks_on_expert_zero, _forgets_tokens_of_other_ranks, _with_routing(_drops_the_last_tile),
          _with_routing(_drops_a_slot), _wrong_scale]


@on_cpu
@pytest.mark.parametrize("broken", BROKEN, ids=["other-ranks-on-expert-0", "forgets-other-ranks-tokens",
                                                "drops-the-last-tile", "drops-a-slot", "wrong-scale"])
def test_gate_fails_a_broken_implementation(broken):
    result = check_module.check("cpu", cases=SMALL, impl=broken)
    assert not result.passed, result.summary


_SLOTWISE = configs.MoeConfig(16, replace(_T, split=2), replace(_T, split=2), slotwise=True)


def _slotwise(x, local_ids, gates, w13, w2, limit, scale):
    return kernel.grouped_routed_experts(x, local_ids, gates, w13, w2, limit, scale, config=_SLOTWISE)


@on_cpu
def test_slotwise_tiles_launch_neither_the_routing_nor_the_combine(monkeypatch):
    """Slotwise: the two GEMM launches alone give the definition's output (the routing and combine
    launches made to fail, which a routed call then hits)."""
    def refuse(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr(kernel, "route", refuse)
    monkeypatch.setattr(kernel, "_moe_combine_kernel", type("K", (), {"__getitem__": lambda self, grid: refuse})())
    result = check_module.check("cpu", cases=SMALL[:1], impl=_slotwise)
    assert result.passed and result.figures["nonfinite"] == 0, result.summary
    x = make_inputs(SMALL[0], "cpu", torch.float16, seed=1)
    with pytest.raises(AssertionError, match="launched"):
        kernel.grouped_routed_experts(*x.args(), config=replace(_SLOTWISE, slotwise=False))


@on_cpu
def test_gate_fails_slotwise_down_with_a_stale_ticket():
    """A token's ticket left at 1 makes down's combine run one arrival early, on rows not yet written
    (NaN-poisoned): the gate must fail it."""
    def slotwise_unsplit(x, local_ids, gates, w13, w2, limit, scale):  # gate/up takes no ticket
        cfg = replace(_SLOTWISE, up=replace(_T, split=1))
        return kernel.grouped_routed_experts(x, local_ids, gates, w13, w2, limit, scale, config=cfg)

    tickets = kernel._tickets(torch.device("cpu"), 1)
    tickets.fill_(1)
    try:
        result = check_module.check("cpu", cases=SMALL[:1], impl=slotwise_unsplit)
    finally:
        tickets.fill_(0)
    assert not result.passed, result.summary


@on_cpu
def test_gate_passes_the_kernels_on_the_same_cases():
    result = check_module.check("cpu", cases=SMALL)
    assert result.passed and result.figures["nonfinite"] == 0, result.summary


def test_plain_torch_path_where_triton_cannot_run(monkeypatch):
    """On a CPU without the interpreter the slot runs the same grouping in torch (expert by expert)."""
    monkeypatch.setattr(kernel, "runs_triton", lambda t: False)
    x = make_inputs(SMALL[0], "cpu", torch.float32, seed=1)
    out = kernel.grouped_routed_experts(*x.args())
    ref = naive.routed_experts(x.x.double(), x.local_ids, x.gates.double(), x.w13, x.w2, x.limit, x.scale)
    assert error_report(out, ref).ok(1e-5), error_report(out, ref)
    assert error_report(routed_experts_sm120(*x.args()), ref).ok(1e-5)


def test_registered_for_the_per_slot_fallback():
    from dsv4opt.optimizations.registry import get, implementations

    opt = get("grouped-moe")
    assert opt.target_category == "moe" and opt.slots == ("routed_experts",) and opt.target_kernels == "slot_gemv"
    assert implementations(["grouped-moe"]) == {"routed_experts": kernel.grouped_routed_experts}


# --- the config table ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", list(configs.TABLE) + [(5, 96, 64)], ids=str)
def test_every_table_row_and_candidate_is_launchable(shape):
    R, I, d = shape
    for slots in (6, 48, 96, 384, 768, 1536, 3072):
        for cfg in configs.candidates(R, I, d, slots):
            for t in (cfg.up, cfg.down):
                assert t.bn % (32 if t.direct else 64) == 0 and t.bk % 64 == 0 and t.warps in (4, 8), cfg
                assert t.split >= 1 and t.ctas >= 1, cfg
            assert cfg.up.direct == cfg.down.direct and (cfg.slotwise or not cfg.up.direct), cfg
            if cfg.up.direct and shape == (256, 512, 4096):  # tp4, where the table runs them: every candidate fits
                assert direct_shape_ok(d, I, *kernel.direct_tiles(cfg)), cfg.name
            assert cfg.bm in (16, 32)
        table = configs.choose(R, I, d, slots)
        assert not table.up.direct or direct_shape_ok(d, I, *kernel.direct_tiles(table)), table.name
        assert table == configs.candidates(R, I, d, slots)[0]


@pytest.mark.parametrize("shape", [(256, 512, 4096), (32, 2048, 4096)], ids=["tp4", "dp-ep"])
def test_warp_specialised_rows_fall_back_to_the_triton_rows_they_replaced(shape):
    """Where the Gluon kernels cannot run, the table's ws rows give way to Triton rows (not to the
    Triton kernels on the ws kernels' tiles); and no sweep candidate names a ws GEMM that could not run
    (split, slotwise or BM 32 tiles)."""
    seen_ws = False
    for c in (1, 2, 3, 4, 8, 16, 32, 64):
        slots = c * 6 * (8 if shape[0] == 32 else 1)
        table, triton = configs.choose(*shape, slots), configs.choose(*shape, slots, ws=False)
        seen_ws |= table.up.ws
        assert not (triton.up.gluon or triton.down.gluon)
        assert table == triton or table.up.gluon
        for cand in configs.candidates(*shape, slots):
            for g in (cand.up, cand.down):
                assert not g.ws or (g.split == 1 and cand.bm == 16 and not cand.slotwise), cand.name
                assert not g.direct or cand.slotwise, cand.name
        assert triton in configs.candidates(*shape, slots)
    assert seen_ws


@on_cpu
def test_moe_blocks_of_the_model_match_the_baseline_on_the_same_input():
    """The tiny model, each MoE block run with grouped-moe and with SGLang's path on identical input
    and state: only float32 summation order separates them; a block that dropped an expert's tile
    is far off."""
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.model import DecodeWorkload

    cfg = ModelConfig.from_name("dsv4-tiny")
    figures = {}
    for name, impl in (("grouped", kernel.grouped_routed_experts), ("broken", _with_routing(_drops_the_last_tile))):
        wl = DecodeWorkload(cfg, concurrency=3, context=40, device="cpu", layers=2, seed=0, dtype=torch.float32)
        rel: list[float] = []
        wl.compare_impls = {"routed_experts": impl}
        wl.on_block = lambda block, i, out, other: block == "ffn_block" and rel.append(error_report(other, out).rel)
        tokens = torch.randint(0, cfg.vocab, (3,), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            wl.step(tokens)
        figures[name] = max(rel)
    assert figures["grouped"] < 1e-5 and figures["broken"] > 1e-2, figures


def test_dequantised_weights_are_what_the_definition_reads():
    """The float64 definition decodes with quant.dequantize_mxfp4: a sanity anchor for the layout test."""
    w = Mxfp4Experts(1, 16, 64, torch.Generator().manual_seed(9), "cpu")
    assert torch.equal(w.dense(0), quant.dequantize_mxfp4(w.packed[0], w.scales[0]))


def _config(case: MoeCase, mode: str | None) -> configs.MoeConfig | None:
    """The table's config for the case (None), slotwise with down's loop nested, or with the
    warp-specialised gate/up kernel (ws), and down's too (ws-down); those must then run: Triton 3.6's
    Gluon on an sm_90 GPU."""
    if mode is None:
        return None
    cfg = configs.choose(case.experts, case.width, case.hidden, case.tokens * case.topk)
    if mode == "slotwise":
        return replace(cfg, slotwise=True, down=replace(cfg.down, flat=False))
    from dsv4opt.workload.kernels.grouped_moe.ws import GLUON_API_OK

    if not (GLUON_API_OK and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("the Gluon kernels need Triton 3.6's Gluon on an sm_90 GPU")
    if mode.startswith("direct"):  # direct-W-REP-SPLIT-W-REP-SPLIT: gate/up's and down's tiles
        v = [int(p) for p in mode.split("-")[1:]]
        return configs.direct_config(tuple(v[:3]), tuple(v[3:]))
    ws = configs.GemmTiles(bn=64, bk=128, warps=4, stages=4, split=1, ctas=2, ws=True)
    down = replace(ws, bn=128) if mode == "ws-down" else configs.GemmTiles(bn=128, bk=128, warps=4, stages=4)
    return replace(cfg, slotwise=False, up=ws, down=down)


_TP4 = dict(width=512, experts=256)
_GRAPH_CASES = [(MoeCase(4, "no_other_ranks", **_TP4), None), (MoeCase(16, "mixed"), None),
                (MoeCase(1, "no_other_ranks", **_TP4), None), (MoeCase(1, "no_other_ranks", **_TP4), "slotwise"),
                (MoeCase(3, "mixed", **_TP4), "slotwise"), (MoeCase(16, "mixed"), "slotwise"),
                (MoeCase(16, "mixed"), "ws"), (MoeCase(13, "no_other_ranks", **_TP4), "ws"),
                (MoeCase(64, "all_on_one", **_TP4), "ws"),
                (MoeCase(5, "mixed", hidden=384, width=128, experts=8), "ws"),  # 3 K steps: the odd tail
                (MoeCase(3, "mixed", hidden=128, width=64, experts=8), "ws"),  # 1 K step
                # down's K is I: 4 steps (tp4), 16 (dp-ep), 1 (the odd tail alone, 3 blocks of d)
                (MoeCase(13, "no_other_ranks", **_TP4), "ws-down"), (MoeCase(64, "all_on_one", **_TP4), "ws-down"),
                (MoeCase(16, "mixed"), "ws-down"), (MoeCase(5, "mixed", hidden=384, width=128, experts=8), "ws-down"),
                # the direct kernels: tp4 at C = 1-3, two slots of a token on one expert, other ranks' slots
                # (dp-ep), 1 and 8 units a split, 8 warps, 4 units of rows a warp
                (MoeCase(1, "no_other_ranks", **_TP4), "direct-4-2-8-4-2-2"),
                (MoeCase(3, "mixed", **_TP4), "direct-4-2-16-4-2-1"), (MoeCase(2, "all_on_one", **_TP4), "direct-4-1-8-4-1-2"),
                (MoeCase(1, "mixed"), "direct-8-1-8-8-1-2"), (MoeCase(5, "mixed", hidden=512, width=128, experts=8), "direct-4-2-8-4-2-2"),
                (MoeCase(2, "no_other_ranks", hidden=1024, width=256, experts=8), "direct-4-4-16-4-4-2"),
                # the table's tiles (16 units a warp on one unit of rows; down's whole K), tp4 and dp-ep's width
                (MoeCase(1, "no_other_ranks", **_TP4), "direct-4-1-4-4-1-1"), (MoeCase(4, "mixed", **_TP4), "direct-4-1-4-4-1-1"),
                (MoeCase(1, "mixed"), "direct-4-1-4-4-1-1")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("case, mode", _GRAPH_CASES, ids=lambda v: v.name if isinstance(v, MoeCase) else (v or "table"))
def test_cuda_graph_replays_match_the_definition_for_new_routings(case, mode, monkeypatch):
    """Captured once (after an eager call builds the weights' copy), replayed on other tokens and
    routings copied into the captured inputs: every replay against float64, NaN-poisoned. Slotwise
    configs too (their tickets a token, other ranks' slots), the warp-specialised gate/up with
    Triton's down (ws), and both warp-specialised (ws-down)."""
    from dsv4opt.numerics import nan_poisoned_allocations

    cfg = _config(case, mode)
    first = make_inputs(case, "cuda", torch.bfloat16, seed=0)
    calls = {"ws_gate_up": 0, "ws_down": 0, "direct_routed_experts": 0}
    for name in calls:  # count the Gluon kernels' launches: they run, not the Triton ones in their place
        def spy(*args, _real=getattr(kernel, name), _name=name, **kw):
            calls[_name] += 1
            return _real(*args, **kw)
        monkeypatch.setattr(kernel, name, spy)
    x, ids, gates = first.x.clone(), first.local_ids.clone(), first.gates.clone()
    kernel.grouped_routed_experts(x, ids, gates, first.w13, first.w2, first.limit, first.scale, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with nan_poisoned_allocations(), torch.cuda.graph(graph):
        out = kernel.grouped_routed_experts(x, ids, gates, first.w13, first.w2, first.limit, first.scale, config=cfg)
    for seed in (1, 2, 3):
        other = make_inputs(case, "cpu", torch.bfloat16, seed=seed)
        x.copy_(other.x)
        ids.copy_(other.local_ids)
        gates.copy_(other.gates)
        graph.replay()
        ref = naive.routed_experts(x.double(), ids, gates.double(), first.w13, first.w2, first.limit, first.scale)
        err = error_report(out, ref)
        assert err.ok(check_module.REL_TOL), (seed, err)
    ws = {"ws": (1, 0), "ws-down": (1, 1)}.get(mode, (None, None))  # the eager call and the capture: 2 each
    if mode and mode.startswith("direct"):
        ws = (0, 0)
        assert calls["direct_routed_experts"] == 2, calls
    for name, want in zip(calls, ws):
        assert want is None or calls[name] == 2 * want, (name, calls)


on_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@on_gpu
def test_gate_passes_on_the_gpu():
    """The whole GPU table: both layouts' model shapes in bf16, the scale path past 2, the small table."""
    result = check_module.check("cuda")
    assert result.passed and result.figures["nonfinite"] == 0, result.summary


@on_gpu
@pytest.mark.parametrize("broken", [_with_routing(_drops_a_slot), _wrong_scale], ids=["drops-a-slot", "wrong-scale"])
def test_gate_fails_a_broken_implementation_on_the_gpu(broken):
    from dsv4opt.optimizations.grouped_moe.cases import TP4

    cases = [MoeCase(8, "mixed"), MoeCase(4, "no_other_ranks", **TP4)]
    result = check_module.check("cuda", cases=cases, impl=broken)
    assert not result.passed, result.summary


@on_gpu
def test_gate_fails_the_direct_kernels_with_stale_tickets():
    """Tickets left past the last arrival's count: no K split's sum (gate/up) and no token's combine
    (down) runs, so act and out stay as allocated (NaN-poisoned): the gate must fail the direct kernels
    so, and pass them with the tickets at 0. (Left at 1, one arrival early, the H200 passed once: each
    split writes its partials before its ticket, so the early sum, racing the last split, found them
    written; a race, not a test.)"""
    from dsv4opt.optimizations.grouped_moe.cases import TP4
    from dsv4opt.workload.kernels.grouped_moe.ws import ws_runs_on

    if not ws_runs_on(torch.empty(1, device="cuda")):
        pytest.skip("the direct kernels need Triton 3.6's Gluon on an sm_90 GPU")
    cfg = configs.direct_config((4, 1, 4), (4, 1, 1))

    def direct(x, local_ids, gates, w13, w2, limit, scale):
        return kernel.grouped_routed_experts(x, local_ids, gates, w13, w2, limit, scale, config=cfg)

    cases = [MoeCase(1, "no_other_ranks", **TP4), MoeCase(2, "mixed", **TP4)]
    clean = check_module.check("cuda", cases=cases, impl=direct)
    assert clean.passed and clean.figures["nonfinite"] == 0, clean.summary
    tickets = kernel._tickets(torch.device("cuda", torch.cuda.current_device()), 1)
    tickets.fill_(1 << 20)
    try:
        result = check_module.check("cuda", cases=cases, impl=direct)
    finally:
        tickets.fill_(0)
    assert not result.passed and result.figures["nonfinite"] > 0, result.summary  # the poisoned rows came out


def test_the_direct_kernels_take_only_tiles_that_fit_the_shape():
    """The shape rule the direct kernels are launched under (no GPU needed): tp4's and dp-ep's shapes
    with the table's tiles, not a width whose K steps a split are not a power of two, nor half-direct
    configs or tiles that are not whole 16-row units a warp."""
    table = DirectTiles(4, 1, 4), DirectTiles(4, 1, 1)
    assert direct_shape_ok(4096, 512, *table) and direct_shape_ok(4096, 2048, *table)
    assert not direct_shape_ok(4096, 192, *table)  # down: 3 units a split
    assert not direct_shape_ok(7168, 512, *table)  # gate/up: 28 units a split
    assert not direct_shape_ok(4096, 512, DirectTiles(4, 1, 1), table[1])  # 64 units a warp at once
    assert not direct_shape_ok(4096, 512, DirectTiles(2, 1, 4), table[1])
    with pytest.raises(ValueError, match="both GEMMs"):
        kernel.direct_tiles(replace(configs.direct_config((4, 1, 4), (4, 1, 1)), down=_T))
    with pytest.raises(ValueError, match="16-row units"):
        kernel.direct_tiles(configs.MoeConfig(16, replace(_T, bn=8, direct=True), replace(_T, direct=True), slotwise=True))


@on_cpu
def test_a_direct_row_where_gluon_cannot_run_launches_the_triton_row_it_replaced(monkeypatch):
    """Not the Triton kernels on the direct tiles: the table's Triton row for the shape (`choose(ws=False)`)."""
    launched = []
    real = kernel._persistent

    def spy(kern, device, tiles, *args, **kw):
        launched.append(tiles)
        return real(kern, device, tiles, *args, **kw)

    monkeypatch.setattr(kernel, "_persistent", spy)
    case = MoeCase(5, "mixed", hidden=192, width=96, experts=6, topk=4)
    x = make_inputs(case, "cpu", torch.float16, seed=4)
    kernel.grouped_routed_experts(*x.args(), config=configs.direct_config((4, 1, 4), (4, 1, 1)))
    want = configs.choose(case.experts, case.width, case.hidden, case.tokens * case.topk, ws=False)
    assert launched == [want.up, want.down]


@pytest.mark.parametrize("limits, programs", [
    (tritonlib.DeviceLimits("sm_90", (9, 0), 132, 232448, 233472, 65536, 2048), 3),
    (tritonlib.DeviceLimits("sm_120", (12, 0), 188, 101376, 102400, 65536, 1536), 1),
])
def test_persistent_programs_an_sm_follow_the_devices_limits(limits, programs):
    """The gate/up kernel's Triton rows ask for 71,168 B of shared memory and 128 registers on 4
    warps (tests/compile/): Hopper holds three an SM, a 100 KB SM one (its shared memory binds)."""
    compiled = SimpleNamespace(n_regs=128, metadata=SimpleNamespace(shared=71168))
    assert kernel._resident(compiled, 4, limits) == programs


def test_the_folded_multiplier_is_two_to_the_scale_minus_one_for_every_byte_that_folds():
    """The multiplier the GPU branches build (the Triton kernels' FOLD branch, the Gluon kernels' PTX)
    read as bf16 is 2^(s - 1) for every e8m0 byte s that folds; the CPU's emulation never reaches it."""
    for s in range(layout.FOLD_MAX_E8M0 + 1):
        bits = torch.tensor([layout.fold_multiplier_bits(s)], dtype=torch.int32).to(torch.int16)
        assert bits.view(torch.bfloat16).item() == 2.0 ** (s - 1), s


def test_the_gluon_decode_adds_the_fold_exponent_to_each_scale_byte():
    """The PTX decode adds FOLD_EXP_ADD to the four scale bytes of a word at once and shifts them into
    bf16's exponent, the same bits as fold_multiplier_bits."""
    from dsv4opt.workload.kernels.grouped_moe import ws

    asm = ws.decode_asm()
    assert f"add.u32 e, $20, 0x{layout.FOLD_EXP_ADD:02X}{layout.FOLD_EXP_ADD:02X}{layout.FOLD_EXP_ADD:02X}{layout.FOLD_EXP_ADD:02X};" in asm
    assert all(f"shl.b32 m{j}, m{j}, {layout.BF16_MANTISSA_BITS};" in asm for j in range(4))
