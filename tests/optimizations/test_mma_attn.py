"""mma-attn: the tensor-core kernel against the float64 reference and the baseline kernel over the
interpreter table (fp16: the interpreter cannot multiply bf16 in tl.dot), its tile variants, a
correctness gate that can fail, and the bench command's refusals.

On a machine with a GPU the same module runs the full bf16 table (`test_full_table_on_gpu`).
"""

from __future__ import annotations

import importlib
from dataclasses import replace
import pytest
import torch
import triton
import triton.language as tl
from rich.console import Console
from typer.testing import CliRunner

from dsv4opt import tritonlib
from dsv4opt.cli import app
from dsv4opt.errors import DsvOptError
from dsv4opt.numerics import error_report
from dsv4opt.optimizations.mma_attn import cases, dispatch, kernel
from dsv4opt.optimizations.mma_attn.cases import AttnCase, interpreter_cases, make_inputs
from dsv4opt.optimizations.registry import get
from dsv4opt.report.decision import print_check
from dsv4opt.workload.attention import sparse_attention_ref
from dsv4opt.workload.attention.naive import used_slots
from dsv4opt.workload.kvcache import KVCache
from tests import benchmark_files
from tests.helpers import needs_gpu

# The package exports the function `check`, which hides the submodule of the same name.
check_module = importlib.import_module("dsv4opt.optimizations.mma_attn.check")
INTERPRETED = type(kernel._mma_sparse_decode_kernel).__name__ == "InterpretedFunction"
on_cpu = pytest.mark.skipif(not INTERPRETED, reason="Triton kernels on the CPU need TRITON_INTERPRET=1 at import")
SMALL = AttnCase(3, 100, "half_unused", heads=8, dim=64, rope_dim=16, tile=16, window=16)


@on_cpu
@pytest.mark.parametrize("case", interpreter_cases(), ids=lambda c: c.name)
def test_kernel_and_baseline_match_reference(case):
    row = check_module.run_case(case, torch.device("cpu"), torch.float16, seed=3)
    assert row["passed"], row
    assert row["nonfinite"] == 0
    assert row["rel_err_o"] <= 1e-2 and row["rel_err_lse"] <= 1e-2


@on_cpu
@pytest.mark.parametrize(
    "tiles",
    [
        kernel.Tiles(16, 32, 1, 4, 1),
        kernel.Tiles(16, 16, 3, 4, 1),
        kernel.Tiles(16, 32, 2, 4, 1, block_v=32),
        kernel.Tiles(16, 16, 4, 4, 1, block_v=16, reload_v=True),
        kernel.Tiles(16, 64, 2, 4, 1, reload_v=True),
        kernel.Tiles(16, 16, 3, 4, 1, block_v=32, reload_v=True, block_d=16),
        kernel.Tiles(16, 32, 1, 4, 1, block_d=32),
    ],
    ids=["single-pass", "split3-bk16", "split2-vsplit2", "split4-vsplit4-reload", "split2-bk64-reload",
         "chunked-d16-vsplit2", "chunked-d32-single-pass"],
)
@pytest.mark.parametrize("layout", ["fp8", "bf16"])
def test_tile_variants_match_reference(tiles, layout):
    x = make_inputs(replace(SMALL, layout=layout), "cpu", torch.float16, seed=5)
    o, lse = kernel.mma_attention(*x.args(), tiles=tiles)
    ref_o, ref_lse = sparse_attention_ref(*x.args())
    assert error_report(o, ref_o).ok(1e-2), error_report(o, ref_o)
    assert error_report(lse, ref_lse).ok(1e-5), error_report(lse, ref_lse)


# SGLang's graph-width rows (cases.GRAPH): 8192 compressed-cache slots a request, at most 128 used
GRAPH_SMALL = dict(heads=8, dim=64, rope_dim=16, tile=16, window=16)


@on_cpu
@pytest.mark.parametrize(
    "tiles",
    [
        None,
        kernel.Tiles(16, 16, 33, 4, 1),
        kernel.Tiles(16, 32, 5, 4, 1, block_v=32, reload_v=True),
        kernel.Tiles(16, 64, 1, 4, 1),
        kernel.Tiles(16, 16, 7, 4, 1, block_v=32, reload_v=True, block_d=16),
    ],
    ids=["planned", "split33-bk16", "split5-vsplit2", "single-pass", "chunked-d16-split7"],
)
@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("layout", ["fp8", "bf16"])
def test_graph_width_rows_match_reference(layout, batch, tiles):
    """Rows 8192 slots wide with a few used ones (mixed lengths, holes of -1 inside the used prefix,
    real tokens past it, the last request with no compressed slot used; outputs NaN-poisoned),
    against the float64 reference, with the planned tiles and with splits mostly idle (33 splits
    over at most 128 + 16 slots), a value split and a single pass."""
    case = AttnCase(batch, 8192, cases.GRAPH, layout=layout, **GRAPH_SMALL)
    x = make_inputs(case, "cpu", torch.float16, seed=11 + batch)
    assert int(x.extra_lengths.max()) <= 2 * cases.GRAPH_VALID and (x.extra_indices >= 0).sum() > 8000 * batch
    if batch > 1:
        assert int(x.extra_lengths[-1]) == 0
    used = used_slots(x.extra_indices, x.extra_lengths)
    assert ((x.extra_indices < 0) & (torch.arange(8192) < x.extra_lengths[:, None])).any()  # holes inside
    o, lse = kernel.mma_attention(*x.args(), tiles=tiles)
    ref_o, ref_lse = sparse_attention_ref(*x.args())
    assert error_report(o, ref_o).ok(1e-2), error_report(o, ref_o)
    assert error_report(lse, ref_lse).ok(1e-5), error_report(lse, ref_lse)
    assert used.sum() < 2 * cases.GRAPH_VALID * batch


@on_cpu
@pytest.mark.parametrize("layout", ["fp8", "bf16"])
def test_graph_width_request_with_nothing_used_gets_the_sink_alone(layout):
    """B = 1, no slot of either cache used (lengths 0, rows of real tokens): o = 0, lse = the sink."""
    x = make_inputs(AttnCase(1, 8192, cases.GRAPH, layout=layout, **GRAPH_SMALL), "cpu", torch.float16, seed=2)
    x.swa_lengths.zero_()
    x.extra_lengths.zero_()
    for tiles in (None, kernel.Tiles(16, 16, 7, 4, 1), kernel.Tiles(16, 16, 1, 4, 1)):
        o, lse = kernel.mma_attention(*x.args(), tiles=tiles)
        assert torch.equal(o, torch.zeros_like(o)), tiles
        assert torch.allclose(lse, x.sink[None, :], rtol=0, atol=1e-6), tiles


@triton.jit
def _split_ranges_kernel(p_len, p_out, len_x_delta, KW: tl.constexpr, KX: tl.constexpr, NSPLIT: tl.constexpr,
                         BK: tl.constexpr):
    """(n_w, start, end) of every (request, split), as kernel.split_slots gives them to the kernels."""
    i_b = tl.program_id(0)
    i_s = tl.program_id(1)
    n_w, start, end = kernel.split_slots(p_len, i_b, i_s, len_x_delta, KW, KX, NSPLIT, BK)
    at = (i_b * NSPLIT + i_s) * 3
    tl.store(p_out + at, n_w)
    tl.store(p_out + at + 1, start)
    tl.store(p_out + at + 2, end)


def _split_ranges(lengths_w, lengths_x, kw, kx, nsplit, bk):
    B = len(lengths_w)
    lengths = torch.tensor(list(lengths_w) + list(lengths_x), dtype=torch.int32)
    out = torch.full((B, nsplit, 3), -7, dtype=torch.int32)
    _split_ranges_kernel[(B, nsplit)](lengths, out, B, KW=kw, KX=kx, NSPLIT=nsplit, BK=bk)
    return out.tolist()


@on_cpu
def test_each_split_runs_whole_tiles_of_the_used_slots_only_whatever_the_rows_width():
    """The splits of a request cover its used slots (window then compressed, lengths clamped to the
    widths) exactly once, in whole tiles but the last, no split more than its share; the same
    lengths give the same trip counts at width 512 and at SGLang's graph width."""
    lengths_w = [128, 128, 0, 100, 128, 128]
    lengths_x = [64, 0, 0, 37, 512, 900]  # the last is longer than a 512-wide row: clamped
    for nsplit, bk in ((1, 64), (2, 64), (5, 32), (33, 16)):
        narrow = _split_ranges(lengths_w, lengths_x, 128, 512, nsplit, bk)
        wide = _split_ranges(lengths_w, [min(n, 512) for n in lengths_x], 128, 8192, nsplit, bk)
        assert narrow == wide, (nsplit, bk)
        for b, splits in enumerate(narrow):
            n_w, n = min(lengths_w[b], 128), min(lengths_w[b], 128) + min(lengths_x[b], 512)
            share = -(-(-(-n // nsplit)) // bk) * bk
            covered = []
            for got_w, start, end in splits:
                assert got_w == n_w
                covered += range(start, end)
                assert end - start <= share and start % bk == 0
            assert covered == list(range(n)), (nsplit, bk, b, splits)


@on_cpu
def test_no_split_runs_more_than_the_plans_chunk_so_one_tile_chunks_need_no_loop():
    """The kernel runs a split as one straight tile where the plan's chunk (the rows all used) is one
    tile: that holds only if no lengths give a split more than the chunk, at any width."""
    for kw, kx, bk, asked in ((16, 1, 32, 33), (128, 512, 32, 20), (128, 512, 64, 2), (128, 8192, 64, 4),
                              (128, 8192, 32, 33), (16, 100, 16, 3)):
        chunk, nsplit = kernel.split_chunks(kw + kx, bk, asked)
        gen = torch.Generator().manual_seed(kx + asked)
        lengths_w = [kw, 0, kw // 2] + torch.randint(0, kw + 1, (5,), generator=gen).tolist()
        lengths_x = [kx, kx, 0] + torch.randint(0, kx + 1, (5,), generator=gen).tolist()
        for _, start, end in (r for splits in _split_ranges(lengths_w, lengths_x, kw, kx, nsplit, bk) for r in splits):
            assert end - start <= chunk, (kw, kx, bk, asked, chunk, start, end)


def _carve(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `tensors` (one dtype) laid out one after the other in a single buffer, in order."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    out, at = [], 0
    for t in tensors:
        out.append(flat[at : at + t.numel()].view(t.shape))
        at += t.numel()
    return out


@on_cpu
@pytest.mark.parametrize("extra_first", [False, True], ids=["extra-above-window", "extra-below-window"])
def test_one_launch_reads_both_caches_wherever_they_lie(extra_first):
    """The kernel reads the compressed cache, its indices and lengths at offsets from the window
    cache's: they must be found whether those buffers lie above or below the window's in memory."""
    x = make_inputs(SMALL, "cpu", torch.float16, seed=9)
    order = (lambda a, b: [b, a]) if extra_first else (lambda a, b: [a, b])
    unorder = (lambda pair: pair[::-1]) if extra_first else (lambda pair: pair)
    swa_data, extra_data = unorder(_carve(order(x.swa.data, x.extra.data)))
    swa_idx, extra_idx = unorder(_carve(order(x.swa_indices, x.extra_indices)))
    swa_len, extra_len = unorder(_carve(order(x.swa_lengths, x.extra_lengths)))
    assert (extra_data.data_ptr() < swa_data.data_ptr()) == extra_first
    assert (extra_idx.data_ptr() < swa_idx.data_ptr()) == extra_first
    args = (x.q, KVCache(x.swa.layout, swa_data), swa_idx, swa_len, KVCache(x.extra.layout, extra_data), extra_idx,
            extra_len, x.sink, x.scale)
    for tiles in (kernel.Tiles(16, 16, 2, 4, 1), kernel.Tiles(16, 32, 3, 4, 1, block_v=32)):
        o, lse = kernel.mma_attention(*args, tiles=tiles)
        ref_o, ref_lse = sparse_attention_ref(*x.args())
        assert error_report(o, ref_o).ok(1e-2), (tiles, error_report(o, ref_o))
        assert error_report(lse, ref_lse).ok(1e-5), (tiles, error_report(lse, ref_lse))



# --- lse_with_sink=False: FlashMLA's lse (the used slots' scores alone, +inf where none is used) ---

def lse_of_scores_ref(x) -> torch.Tensor:
    """float64 [B, H]: the reference's lse with the sink at -inf (the scores alone), +inf where no
    slot of either cache is used (FlashMLA's tests/ref.py)."""
    args = list(x.args())
    args[7] = torch.full_like(x.sink, float("-inf"))
    _, lse = sparse_attention_ref(*args)
    return torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)


def assert_lse_of_scores(lse: torch.Tensor, ref: torch.Tensor, tol: float = 2e-5) -> None:
    """+inf exactly where the reference has it, nothing else non-finite (NaN-poisoned outputs), every
    finite element within tol * max(1, |ref|); the worst element named."""
    assert lse.dtype == torch.float32 and lse.shape == ref.shape
    lse, ref = lse.cpu().double(), ref.cpu().double()
    assert torch.equal(torch.isposinf(lse), torch.isposinf(ref)), (lse, ref)
    finite = torch.isfinite(ref)
    assert torch.isfinite(lse[finite]).all(), lse
    err = torch.where(finite, (lse - ref).abs() / ref.abs().clamp(min=1.0), torch.zeros_like(ref))
    worst = divmod(int(err.argmax()), ref.shape[1])
    assert float(err.max()) <= tol, (
        f"rel {float(err.max()):.2e} at {list(worst)}: {float(lse[worst])} against {float(ref[worst])}")


LSE_TILES = [None, kernel.Tiles(16, 32, 1, 4, 1), kernel.Tiles(16, 16, 3, 4, 1),
             kernel.Tiles(16, 32, 2, 4, 1, block_v=32, reload_v=True)]
LSE_TILE_IDS = ["planned", "single-pass", "split3-bk16", "split2-vsplit2"]
# (case, sink): "one_empty" leaves request 0 with every slot -1 and the last with lengths 0 (both
# caches): +inf there. "big": the sink 60 above every score, where lse - log(1 - exp(sink - lse))
# loses every digit; "none": SGLang's stand-in for no sink (sglang_entry._NO_SINK).
LSE_CASES = [
    (AttnCase(3, 37, "one_empty", **GRAPH_SMALL), "randn"),
    (AttnCase(3, 37, "half_unused", layout="bf16", **GRAPH_SMALL), "big"),
    (AttnCase(1, 1, "one_empty", **GRAPH_SMALL), "randn"),  # B = 1, every slot -1: nothing used at all
    (AttnCase(3, 0, "one_empty", **GRAPH_SMALL), "none"),  # window-only layer
    (AttnCase(2, 256, cases.GRAPH, **GRAPH_SMALL), "big"),  # graph-width rows, the last request's extra empty
]


@on_cpu
@pytest.mark.parametrize("tiles", LSE_TILES, ids=LSE_TILE_IDS)
@pytest.mark.parametrize("case,sink", LSE_CASES, ids=lambda v: v.name if isinstance(v, AttnCase) else v)
def test_lse_without_sink_is_the_scores_log_sum_exp(case, sink, tiles):
    """lse_with_sink=False against the float64 reference over the awkward table, split and single
    pass: the used slots' log-sum-exp, +inf where none is used, o unchanged (the sink still in it)."""
    x = make_inputs(case, "cpu", torch.float16, seed=21)
    if sink == "big":
        x = replace(x, sink=torch.full_like(x.sink, 60.0))
    elif sink == "none":
        x = replace(x, sink=torch.full_like(x.sink, -1.0e20))
    ref = lse_of_scores_ref(x)
    if case.pattern == "one_empty":
        assert torch.isposinf(ref).any()
    o, lse = kernel.mma_attention(*x.args(), tiles=tiles, lse_with_sink=False)
    assert_lse_of_scores(lse, ref)
    ref_o, _ = sparse_attention_ref(*x.args())
    if sink == "big":  # o is scaled by about e^-57: zero in fp16, so only absolutely close
        assert error_report(o, ref_o).max_abs < 1e-6, error_report(o, ref_o)
    else:
        assert error_report(o, ref_o).ok(1e-2), error_report(o, ref_o)


@on_cpu
@pytest.mark.parametrize("tiles", LSE_TILES[1:3], ids=LSE_TILE_IDS[1:3])
def test_lse_without_sink_fails_the_check_when_the_flag_is_ignored(tiles):
    """The flag reaches the kernels: False and True give different lse where a slot is used (the
    sink weighs in), each meeting its own reference and failing the other's; o is the same."""
    x = make_inputs(AttnCase(3, 37, "one_empty", **GRAPH_SMALL), "cpu", torch.float16, seed=22)
    x = replace(x, sink=torch.full_like(x.sink, 3.0))  # about the scores' lse: moves it by ~log 2
    o_without, without = kernel.mma_attention(*x.args(), tiles=tiles, lse_with_sink=False)
    o_with, with_sink = kernel.mma_attention(*x.args(), tiles=tiles)
    _, ref_with = sparse_attention_ref(*x.args())
    assert_lse_of_scores(without, lse_of_scores_ref(x))
    assert error_report(with_sink, ref_with).ok(1e-5)
    with pytest.raises(AssertionError):
        assert_lse_of_scores(with_sink, lse_of_scores_ref(x))
    assert torch.equal(o_without, o_with)
    assert torch.isposinf(without[0]).all() and torch.allclose(with_sink[0], x.sink, atol=1e-6)


def _combine_kernel(o_part, lse_part, sink, split_loop, **flags):
    """The combine kernel launched straight (one program a request and head) into NaN-filled o, lse."""
    B, S, H, D = o_part.shape
    o = torch.full((B, H, D), float("nan"))
    lse = torch.full((B, H), float("nan"))
    kernel._attn_combine_splits_kernel[(B, H)](
        p_o_part=o_part, p_lse_part=lse_part, p_sink=sink, p_o=o, p_lse=lse, stride_ob=o.stride(0),
        stride_oh=o.stride(1), H=H, NSPLIT=S, NS_P=triton.next_power_of_2(S), D=D, D_P=D,
        SPLIT_LOOP=split_loop, **flags)
    return o, lse


@on_cpu
@pytest.mark.parametrize("split_loop", [False, True], ids=["tile", "split-loop"])
def test_the_combine_without_the_sink_merges_the_splits_lse_alone(split_loop):
    """The combine with LSE_WITH_SINK False against the merge written out in float64: lse =
    log sum 2^(lse_s) (natural log) over the splits, +inf where every split is empty, whatever the
    sink (one of 200, far above the splits: the sum taken next to it would underflow); o as with it."""
    gen = torch.Generator().manual_seed(4)
    B, S, H, D = 2, 5, 4, 64
    lse_part = torch.randn(B, S, H, generator=gen) * 3
    lse_part[0, 2] = float("-inf")
    lse_part[1, :, 1] = float("-inf")  # request 1, head 1: nothing used in any split
    sink = torch.randn(H, generator=gen)
    sink[3] = 200.0
    o_part = torch.randn(B, S, H, D, generator=gen).to(torch.float16 if split_loop else torch.float32)
    ref = torch.logsumexp(lse_part.double() * kernel.LN2, dim=1)
    ref = torch.where(torch.isneginf(ref), torch.full_like(ref, float("inf")), ref)
    outs = {}
    for with_sink in (True, False):
        o, lse = _combine_kernel(o_part, lse_part, sink, split_loop, LSE_WITH_SINK=with_sink)
        outs[with_sink] = (o, lse)
    assert_lse_of_scores(outs[False][1], ref, tol=1e-6)
    assert torch.equal(outs[False][0], outs[True][0]) and not torch.isnan(outs[False][0]).any()


@needs_gpu
@pytest.mark.parametrize("sink", ["randn", "big"])
@pytest.mark.parametrize("layout", ["fp8", "bf16"])
@pytest.mark.parametrize("batch", [1, 32, 64, 100])
def test_lse_without_sink_at_the_models_sizes_on_gpu(batch, layout, sink):
    """bf16 at 64 heads of 512 on the GPU: B = 1 on the block-level kernel, 32 and 64 through the
    Gluon loops' partials and the combine where they run, 100 a single pass; one request empty."""
    x = make_inputs(AttnCase(batch, 512, "one_empty", layout=layout), "cuda", torch.bfloat16, seed=23)
    if sink == "big":
        x = replace(x, sink=torch.full_like(x.sink, 60.0))
    o, lse = kernel.mma_attention(*x.args(), lse_with_sink=False)
    assert_lse_of_scores(lse, lse_of_scores_ref(x))
    ref_o, _ = sparse_attention_ref(*x.args())
    if sink == "big":
        assert error_report(o, ref_o).max_abs < 1e-6, error_report(o, ref_o)
    else:
        assert error_report(o, ref_o).ok(1e-2), error_report(o, ref_o)

def test_choose_tiles_splits_the_value_columns_only_at_small_batch():
    cpu = torch.device("cpu")
    assert kernel.choose_tiles(kernel.SMALL_BATCH_MAX, 64, 640, cpu).block_v == kernel.SMALL_BATCH_TILES["block_v"]
    for batch in (kernel.SMALL_BATCH_MAX + 1, 16, 64):
        assert kernel.choose_tiles(batch, 64, 640, cpu).block_v == 0
    # a latent narrower than the value slice keeps its whole width
    assert kernel.choose_tiles(1, 64, 640, cpu, dim=64).block_v == 0


@on_cpu
def test_gate_fails_on_wrong_output(monkeypatch):
    real = kernel.mma_attention

    def off_by_two_percent(*args, **kwargs):
        o, lse = real(*args, **kwargs)
        return o * 1.02, lse

    monkeypatch.setattr(kernel, "mma_attention", off_by_two_percent)
    result = check_module.check("cpu", [SMALL])
    assert not result.passed
    assert result.figures["rel_err_o"] > result.bounds["rel_err_o"]
    assert "FAILED" in result.summary


@on_cpu
def test_gate_fails_on_unwritten_output(monkeypatch):
    monkeypatch.setattr(kernel, "mma_attention", lambda q, *a, **k: (torch.empty_like(q), torch.empty(q.shape[:2])))
    result = check_module.check("cpu", [SMALL])
    assert not result.passed
    assert result.figures["nonfinite"] > 0


@on_cpu
def test_gate_passes_and_reports_figures():
    result = check_module.check("cpu", [SMALL, interpreter_cases()[-1]])
    assert result.passed, result.summary
    assert set(result.bounds) <= set(result.figures)
    assert result.figures["cases"] == 2 and result.device.startswith("cpu")
    # what ran, and why the Gluon loops did not: printed by `list --check` under the summary
    assert result.notes == ("main loops: block-level 2",
                            "Gluon loops off here: Triton's interpreter runs the kernels; the block-level kernel runs instead")
    console = Console(record=True, width=80)
    print_check(result, console)
    assert "Gluon loops off here: Triton's interpreter" in " ".join(console.export_text().split())


def test_the_gate_names_each_main_loop_it_ran():
    rows = [{"engine": e} for e in ("gluon-fp8-ws", "gluon-fp8-ws", "triton", "gluon-ws")]
    notes = check_module.engine_notes(rows)
    assert notes[0] == "main loops: FP8 warp-specialised 2, block-level 1, bf16 warp-specialised 1"


def test_registry_provides_the_attention_slot():
    impls = get("mma-attn").implementations()
    assert impls == {"attention": kernel.mma_attention}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_bench_without_gpu_is_a_one_line_error():
    result = CliRunner().invoke(app, ["bench", "mma-attn"])
    assert result.exit_code == 1
    assert "needs a CUDA GPU" in result.output and "Traceback" not in result.output


def test_bench_refuses_unknown_name_and_existing_json(tmp_path):
    result = CliRunner().invoke(app, ["bench", "mma-atn"])
    assert result.exit_code == 1 and "unknown benchmark 'mma-atn'" in result.output
    existing = tmp_path / "out.json"
    existing.write_text("{}")
    result = CliRunner().invoke(app, ["bench", "mma-attn", "--json", str(existing)])
    assert result.exit_code == 1 and "already exists" in result.output
    assert existing.read_text() == "{}"


def test_choose_tiles_takes_narrow_tiles_for_four_byte_q():
    cpu = torch.device("cpu")
    for batch in (1, 64):
        for fp8 in (True, False):
            t = kernel.choose_tiles(batch, 64, 640, cpu, fp8=fp8, itemsize=4)
            assert (t.block_k, t.num_stages, t.block_v) == (16, 2, 0)
    assert kernel.choose_tiles(64, 64, 640, cpu, fp8=True).block_k == kernel.FP8_TILES["block_k"]


@needs_gpu
@pytest.mark.parametrize("layout", ["fp8", "bf16"])
@pytest.mark.parametrize("batch", [3, 64])
def test_float32_q_runs_at_the_models_sizes(batch, layout):
    """The model's float32 runs (the torch-compile gate's) call the kernel with fp32 q: the bf16
    tiles would ask for 384 KiB of shared memory there and fail to launch."""
    case = AttnCase(batch, 512, "short", layout=layout)
    row = check_module.run_case(case, torch.device("cuda"), torch.float32, seed=5)
    assert row["passed"] and row["nonfinite"] == 0, row


@needs_gpu
def test_full_table_on_gpu():
    result = check_module.check("cuda")
    assert result.passed, result.summary


def test_cpu_tensors_without_interpreter_are_refused(monkeypatch):
    from dsv4opt.errors import DsvOptError

    monkeypatch.setattr(kernel, "_INTERPRETED", False)
    x = make_inputs(SMALL, "cpu", torch.float16)
    with pytest.raises(DsvOptError, match="runs on a CUDA GPU"):
        kernel.mma_attention(*x.args())


def test_bench_rotation_spans_several_l2s_of_rows():
    from dsv4opt.optimizations.mma_attn.bench import L2_SPAN, MAX_SETS, TOPK, WINDOW, sets_needed

    l2 = 50 * 2**20  # an H100-class L2
    for batch in (1, 16, 32, 64):
        per_call = batch * (TOPK + WINDOW) * 584
        n = sets_needed(per_call, l2)
        assert n >= 2
        assert n * per_call >= L2_SPAN * l2 or n == MAX_SETS
    # one B = 32 call selects 12 MB of FP8 rows: a replay of the same indices would find them in L2
    assert sets_needed(32 * (TOPK + WINDOW) * 584, l2) >= 12


def test_gluon_main_loop_only_for_the_shapes_it_was_gated_on():
    cpu = torch.device("cpu")
    wide = kernel.choose_tiles(64, 64, 640, cpu)  # whole width, 64-row tiles, split in two
    q_strides = (64 * 512, 512, 1)
    assert dispatch.gluon_shape_ok(64, 512, wide, True, q_strides, 1)
    assert not dispatch.gluon_shape_ok(64, 512, wide, False, q_strides, 1)  # split nope/rope layout
    assert not dispatch.gluon_shape_ok(32, 512, wide, True, q_strides, 1)  # not one warpgroup of heads
    for dim in (64, 256, 576, 1024):  # its layouts and shared memory are sized for 512
        assert not dispatch.gluon_shape_ok(64, dim, wide, True, (64 * dim, dim, 1), 1)
    assert not dispatch.gluon_shape_ok(64, 512, wide, True, (64 * 1024, 1024, 1), 1)  # q rows strided
    assert not dispatch.gluon_shape_ok(64, 512, wide, True, q_strides, 2)  # indices strided
    small = kernel.choose_tiles(1, 64, 640, cpu)  # value-split tiles at small B
    assert not dispatch.gluon_shape_ok(64, 512, small, True, q_strides, 1)
    single_pass = kernel.choose_tiles(256, 64, 640, cpu)  # no split: no partials to merge
    assert single_pass.nsplit == 1 and not dispatch.gluon_shape_ok(64, 512, single_pass, True, q_strides, 1)
    swept = replace(wide, num_warps=4)  # another family than the one it implements
    assert not dispatch.gluon_shape_ok(64, 512, swept, True, q_strides, 1)


class _FakeCudaTensor:
    """What engine() and plan() read of a tensor, for a dispatch test without a GPU (a CPU device,
    so that the tile choice assumes an H200's 132 SMs)."""

    is_cuda = True
    device = torch.device("cpu")

    def __init__(self, shape, strides, dtype=torch.bfloat16, ptr=1 << 20):
        self.shape, self._strides, self.dtype, self._ptr = shape, strides, dtype, ptr

    def element_size(self):
        return torch.tensor([], dtype=self.dtype).element_size()

    def is_contiguous(self):
        expected, step = [], 1
        for n in reversed(self.shape):
            expected.insert(0, step)
            step *= n
        return tuple(self._strides) == tuple(expected)

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def data_ptr(self):
        return self._ptr


def test_engine_takes_the_gluon_loop_only_with_aligned_bf16_rows(monkeypatch):
    from dsv4opt.workload.kvcache import KVCache, KVLayout

    wide = kernel.choose_tiles(64, 64, 640, torch.device("cpu"))
    q = _FakeCudaTensor((64, 64, 512), (64 * 512, 512, 1))
    bf16 = KVLayout(False, 448, 64, 64, 256)
    rows = KVCache(bf16, _FakeCudaTensor((1 << 20, 512), (512, 1)))
    idx = _FakeCudaTensor((64, 640), (640, 1), dtype=torch.int32)
    monkeypatch.setattr(dispatch, "gluon_available", lambda: True)
    assert dispatch.cache_engine(q, rows, idx, wide) == "gluon"
    assert dispatch.cache_engine(q, KVCache(bf16, _FakeCudaTensor((1 << 20, 512), (520, 1))), idx, wide) == "triton"  # padded rows
    assert dispatch.cache_engine(q, KVCache(bf16, _FakeCudaTensor((1 << 20, 512), (512, 1), ptr=8)), idx, wide) == "triton"
    fp16 = _FakeCudaTensor((64, 64, 512), (64 * 512, 512, 1), dtype=torch.float16)
    assert dispatch.cache_engine(fp16, rows, idx, wide) == "triton"
    fp8 = KVCache(KVLayout(True, 448, 64, 64, 256), _FakeCudaTensor((4, 149760), (149760, 1), dtype=torch.uint8))
    assert dispatch.cache_engine(q, fp8, idx, wide) == "triton"  # the FP8 layout is dequantised by the block-level kernel
    monkeypatch.setattr(dispatch, "gluon_available", lambda: False)
    assert dispatch.cache_engine(q, rows, idx, wide) == "triton"


def test_gluon_available_only_on_hopper_with_a_validated_triton(monkeypatch):
    """And where not, gluon_unavailable_reason says why (what `list --check` prints)."""
    monkeypatch.setattr(dispatch, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dispatch, "device_limits", lambda device: SM90)
    monkeypatch.setattr(dispatch.triton, "__version__", "3.6.0")
    monkeypatch.delenv("DSV4OPT_MMA_ATTN_GLUON", raising=False)
    cases = [
        ({}, ""),
        ({"__version__": "3.9.0"}, "Triton 3.9.0, validated on 3.6.x only"),
        ({"capability": (10, 0)}, "compute capability 10.0, not Hopper"),
        ({"capability": (8, 0)}, "compute capability 8.0, not Hopper"),
        ({"env": "0"}, "DSV4OPT_MMA_ATTN_GLUON=0"),
        ({"interpreted": True}, "interpreter"),
        ({"cuda": False}, "no CUDA device"),
    ]
    try:
        for change, expected in cases:
            dispatch.gluon_unavailable_reason.cache_clear()
            with monkeypatch.context() as m:
                if "__version__" in change:
                    m.setattr(dispatch.triton, "__version__", change["__version__"])
                if "capability" in change:
                    m.setattr(dispatch, "device_limits", lambda device, c=change["capability"]: replace(SM90, capability=c))
                if "env" in change:
                    m.setenv("DSV4OPT_MMA_ATTN_GLUON", change["env"])
                if "interpreted" in change:
                    m.setattr(dispatch, "INTERPRETED", True)
                if "cuda" in change:
                    m.setattr(torch.cuda, "is_available", lambda: False)
                reason = dispatch.gluon_unavailable_reason()
                assert dispatch.gluon_available() is (expected == ""), change
                assert (expected in reason) if expected else reason == "", (change, reason)
    finally:
        dispatch.gluon_unavailable_reason.cache_clear()


def test_bench_rotation_calls_each_set_in_turn():
    from dsv4opt.optimizations.mma_attn.bench import rotating

    seen = []
    sets = [(f"q{i}", f"w{i}", f"wl{i}", f"idx{i}", f"len{i}", f"sink{i}") for i in range(3)]
    record = lambda q, swa, w, wl, extra, idx, ln, sink, scale: seen.append((q, swa, extra, idx, scale))  # noqa: E731
    call = rotating(record, "swa", "extra", sets, 0.5)
    for _ in range(7):
        call()
    assert [q for q, *_ in seen] == ["q0", "q1", "q2", "q0", "q1", "q2", "q0"]
    assert all(swa == "swa" and extra == "extra" and scale == 0.5 and idx == "idx" + q[1:]
               for q, swa, extra, idx, scale in seen)


def test_split_chunks_cover_every_slot_with_whole_tiles_and_no_empty_split():
    for topk in (1, 63, 64, 100, 512, 640, 2048):
        for block_k in (16, 32, 64):
            for asked in (1, 2, 3, 4, 10, 20, 200):
                chunk, nsplit = kernel.split_chunks(topk, block_k, asked)
                assert chunk % block_k == 0 and 1 <= nsplit <= max(1, asked)
                assert (nsplit - 1) * chunk < topk <= nsplit * chunk, (topk, block_k, asked, chunk, nsplit)


def _fp8_caches(swa_ptr=1 << 20, extra_ptr=1 << 30, tile=64):
    from dsv4opt.workload.kvcache import KVLayout

    w, x = KVLayout(True, 448, 64, tile, 256), KVLayout(True, 448, 64, tile, 64)
    swa = KVCache(w, _FakeCudaTensor((64, w.page_bytes), (w.page_bytes, 1), dtype=torch.uint8, ptr=swa_ptr))
    extra = KVCache(x, _FakeCudaTensor((4096, x.page_bytes), (x.page_bytes, 1), dtype=torch.uint8, ptr=extra_ptr))
    return swa, extra


def test_fused_engine_takes_the_fp8_loop_only_where_it_applies(monkeypatch):
    cpu = torch.device("cpu")
    wide = kernel.choose_tiles(64, 64, 640, cpu, fp8=True)  # whole width, 64-row tiles, split in two
    q = _FakeCudaTensor((64, 64, 512), (64 * 512, 512, 1))
    widx = _FakeCudaTensor((64, 128), (128, 1), dtype=torch.int32)
    xidx = _FakeCudaTensor((64, 512), (512, 1), dtype=torch.int32)
    swa, extra = _fp8_caches()
    monkeypatch.setattr(dispatch, "gluon_available", lambda: True)
    assert dispatch.fused_engine(q, swa, widx, extra, xidx, wide) == "gluon-fp8-ws"
    assert dispatch.fused_engine(q, swa, widx, None, None, wide) == "gluon-fp8-ws"  # a window-only layer
    for s, x in (_fp8_caches(swa_ptr=(1 << 20) + 8), _fp8_caches(extra_ptr=(1 << 30) + 4)):
        assert dispatch.fused_engine(q, s, widx, x, xidx, wide) == "triton"  # cp.async moves 16 aligned bytes
    assert dispatch.fused_engine(q, *_fp8_caches(tile=32)[:1], widx, None, None, wide) == "triton"  # another geometry
    fp16 = _FakeCudaTensor((64, 64, 512), (64 * 512, 512, 1), dtype=torch.float16)
    assert dispatch.fused_engine(fp16, swa, widx, extra, xidx, wide) == "triton"
    strided = _FakeCudaTensor((64, 512), (1024, 2), dtype=torch.int32)
    assert dispatch.fused_engine(q, swa, widx, extra, strided, wide) == "triton"
    assert dispatch.fused_engine(q, swa, strided, extra, xidx, wide) == "triton"
    small = kernel.choose_tiles(1, 64, 640, cpu, fp8=True)  # value-split tiles at small B
    single_pass = kernel.choose_tiles(256, 64, 640, cpu, fp8=True)  # no split: no partials to merge
    for tiles in (small, single_pass, replace(wide, block_k=32)):
        assert dispatch.fused_engine(q, swa, widx, extra, xidx, tiles) == "triton", tiles
    monkeypatch.setattr(dispatch, "gluon_available", lambda: False)
    assert dispatch.fused_engine(q, swa, widx, extra, xidx, wide) == "triton"


def test_fp8_dispatch_on_the_cpu_is_the_block_level_kernel(monkeypatch):
    monkeypatch.setattr(dispatch, "gluon_available", lambda: True)
    for case in interpreter_cases():
        x = make_inputs(case, "cpu", torch.float16)
        p = kernel.plan(x.q, x.swa, x.swa_indices, x.extra, x.extra_indices)
        assert p.engine == "triton", case.name


def test_plan_gives_the_fp8_gluon_loop_the_block_level_chunks(monkeypatch):
    from dsv4opt.workload.kvcache import KVLayout

    q = torch.empty(64, 64, 512, dtype=torch.bfloat16)
    swa = KVCache(KVLayout(True, 448, 64, 64, 256), torch.empty(1, 1, dtype=torch.uint8))
    extra = KVCache(KVLayout(True, 448, 64, 64, 64), torch.empty(1, 1, dtype=torch.uint8))
    widx, xidx = torch.empty(64, 128, dtype=torch.int32), torch.empty(64, 512, dtype=torch.int32)
    block = kernel.plan(q, swa, widx, extra, xidx)
    monkeypatch.setattr(kernel, "fused_engine", lambda *a: "gluon-fp8-ws")
    loop = kernel.plan(q, swa, widx, extra, xidx)
    assert (block.engine, loop.engine) == ("triton", "gluon-fp8-ws")
    assert (loop.tiles, loop.chunk, loop.nsplit) == (block.tiles, block.chunk, block.nsplit)
    assert loop.chunk % 64 == 0 and loop.nsplit == 2  # two splits of 320 slots at B = 64


def _fp8_plan_inputs():
    from dsv4opt.workload.kvcache import KVLayout

    q = torch.empty(64, 64, 512, dtype=torch.bfloat16)
    swa = KVCache(KVLayout(True, 448, 64, 64, 256), torch.empty(1, 1, dtype=torch.uint8))
    extra = KVCache(KVLayout(True, 448, 64, 64, 64), torch.empty(1, 1, dtype=torch.uint8))
    return q, swa, torch.empty(64, 128, dtype=torch.int32), extra, torch.empty(64, 512, dtype=torch.int32)



@pytest.mark.parametrize("engine", ["gluon-ws", "gluon-fp8-ws"])
@pytest.mark.parametrize("lse_with_sink", [True, False])
def test_mma_attention_hands_a_warp_specialised_loop_bf16_partials_and_runs_the_combine(monkeypatch, engine,
                                                                                         lse_with_sink):
    """The warp-specialised loop of the layout (bf16 rows or FP8) writes bf16 partials of every
    split and the combine merges them into o and lse (with or without the sink in lse)."""
    from dsv4opt.optimizations.mma_attn import kernel_gluon_bf16_ws, kernel_gluon_fp8_ws

    fp8 = engine == "gluon-fp8-ws"
    x = make_inputs(AttnCase(2, 512, "all", layout="fp8" if fp8 else "bf16"), "cpu", torch.bfloat16)
    tiles = kernel.Tiles(64, 64, 2, 8, 2)
    monkeypatch.setattr(kernel, "_INTERPRETED", True)  # past the CPU guard: only recorders run here
    monkeypatch.setattr(kernel, "plan", lambda *a: kernel.Plan(engine, tiles, 320, 2))
    launched, combined = [], []
    module, name = ((kernel_gluon_fp8_ws, "gluon_fp8_ws_sparse_decode_partials") if fp8
                    else (kernel_gluon_bf16_ws, "gluon_bf16_ws_sparse_decode_partials"))
    monkeypatch.setattr(module, name, lambda *a, **k: launched.append((a, k)))
    monkeypatch.setattr(kernel, "combine_splits", lambda *a: combined.append(a))
    o, lse = kernel.mma_attention(*x.args(), lse_with_sink=lse_with_sink)
    (args, kw), = launched
    assert args[7].shape == (2, 2, 64, 512) and args[7].dtype == torch.bfloat16 and args[9] == 2  # o_part, splits
    assert not kw
    (c,), = [combined]
    assert c[0] is args[7] and c[1] is args[8] and c[3] is o and c[4] is lse and c[5] is lse_with_sink


@pytest.mark.skipif(not __import__("triton").__version__.startswith(dispatch.GLUON_VALIDATED_TRITON),
                    reason="the Gluon loops are compiled and gated on Triton 3.6 only")
@pytest.mark.parametrize("kx", [512, 8192])
def test_gluon_loops_compile_for_sm90_without_spills(tmp_path, kx):
    """Compiled ahead of time for an H200 (no GPU needed): the warp-specialised loops (FP8 and bf16
    rows, bf16 partials staged) and the per-cache bf16 loop, also with rows at SGLang's graph width
    (8192 compressed slots: the loops' index staging is a ring, so shared memory does not grow with
    it). No spills, within 227 KB of shared memory, every
    gather a cp.async that zero-fills masked rows, 16 bytes wide for the data records; the
    warp-specialised loops with their register budgets set per partition."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root)
    out = tmp_path / "compile.json"
    kernels, batches = "fp8-ws,bf16-ws,bf16", "1,32,64"
    done = subprocess.run([sys.executable, str(benchmark_files.path("compile_mma_attn_gluon_sm90.py")), "--kernel", kernels,
                           "--batch", batches, "--kx", str(kx), "--json", str(out)], capture_output=True, text=True,
                          env=env, timeout=900, cwd=str(root))
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == len(batches.split(",")) * len(kernels.split(","))
    for row in rows:
        assert row["spill_store_bytes"] == 0 and row["spill_load_bytes"] == 0, row
        assert row["fits_227KB"], row
        if "warp-specialised" in row["kernel"]:
            assert {"208", "88"} <= set(row["setmaxnreg"]), row  # consumers 208, producer 88 registers
        widths = row["cp_async_by_width"]
        assert widths["16"] > 0 and widths["8"] == 0, row
        assert row["cp_async_zero_fill"] == sum(widths.values()), row



@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="needs CUDA's nvcc (no GPU needed)")
def test_the_cluster_merge_probe_compiles_for_sm90a_without_spills(tmp_path):
    """benchmarks/probe_cluster_merge.cu, the price of merging two splits through a cluster's shared
    memory, builds for sm_90a as its header says; the four kernels that start from a split's
    accumulator (the cluster merge in fp32 and bf16) hold its 128 values a thread in registers (at
    least 128 registers, no stack), and the merge is a cluster one: the peer's shared memory mapped, the cluster barrier used."""
    import re
    import subprocess

    src = benchmark_files.path("probe_cluster_merge.cu")
    arch = ["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a"]
    built = subprocess.run(["nvcc", *arch, "-Xptxas", "-v", str(src), "-o", str(tmp_path / "pcm")],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    frames = [line for line in built.stderr.splitlines() if "stack frame" in line]
    assert len(frames) == 5 and all(line.strip().startswith("0 bytes stack frame, 0 bytes spill") for line in frames)
    mangled = re.findall(r"Compiling entry function '(_Z\d+\w+)'", built.stderr)
    regs = dict(zip(mangled, map(int, re.findall(r"Used (\d+) registers", built.stderr))))
    base = {m: m[2 + len(n) : 2 + len(n) + int(n)] for m in mangled for n in [re.match(r"_Z(\d+)", m).group(1)]}
    assert sorted(base.values()) == ["cluster_merge", "cluster_merge", "combine", "store_half", "write_partials"], base
    assert all(r >= 128 for m, r in regs.items() if base[m] != "combine"), regs
    ptx = subprocess.run(["nvcc", *arch, "-ptx", str(src), "-o", str(tmp_path / "pcm.ptx")], capture_output=True,
                         text=True, timeout=300)
    assert ptx.returncode == 0, ptx.stderr[-2000:]
    text = (tmp_path / "pcm.ptx").read_text()
    assert "mapa" in text and "barrier.cluster.arrive" in text and "barrier.cluster.wait" in text

def test_fused_engine_takes_one_launch_over_both_bf16_caches_only_where_it_applies(monkeypatch):
    """bf16 rows: the warp-specialised loop (one launch over both caches, the fused chunks) where
    the operands suit it; else "" (kernel_gluon.py per cache or kernel.py decide)."""
    from dsv4opt.workload.kvcache import KVLayout

    cpu = torch.device("cpu")
    wide = kernel.choose_tiles(64, 64, 640, cpu)
    q = _FakeCudaTensor((64, 64, 512), (64 * 512, 512, 1))
    widx = _FakeCudaTensor((64, 128), (128, 1), dtype=torch.int32)
    xidx = _FakeCudaTensor((64, 512), (512, 1), dtype=torch.int32)

    def cache(ptr=1 << 20, stride=512):
        return KVCache(KVLayout(False, 448, 64, 64, 256), _FakeCudaTensor((1 << 16, 512), (stride, 1), ptr=ptr))

    swa, extra = cache(), cache(ptr=1 << 30)
    monkeypatch.setattr(dispatch, "gluon_available", lambda: True)
    assert dispatch.fused_engine(q, swa, widx, extra, xidx, wide) == "gluon-ws"
    assert dispatch.fused_engine(q, swa, widx, None, None, wide) == "gluon-ws"  # a window-only layer
    assert dispatch.fused_engine(q, swa, widx, cache(ptr=(1 << 30) + 8), xidx, wide) == ""  # 16-byte rows
    assert dispatch.fused_engine(q, swa, widx, cache(ptr=1 << 30, stride=1024), xidx, wide) == ""  # one row stride
    strided = _FakeCudaTensor((64, 512), (1024, 2), dtype=torch.int32)
    assert dispatch.fused_engine(q, swa, widx, extra, strided, wide) == ""
    fp8_swa, fp8_extra = _fp8_caches()
    assert dispatch.fused_engine(q, fp8_swa, widx, fp8_extra, xidx, wide) == "gluon-fp8-ws"  # FP8 rows: the FP8 loop
    fp16 = _FakeCudaTensor((64, 64, 512), (64 * 512, 512, 1), dtype=torch.float16)
    assert dispatch.fused_engine(fp16, swa, widx, extra, xidx, wide) == ""
    for tiles in (kernel.choose_tiles(1, 64, 640, cpu), kernel.choose_tiles(256, 64, 640, cpu)):
        assert dispatch.fused_engine(q, swa, widx, extra, xidx, tiles) == "", tiles  # value split; no split
    monkeypatch.setattr(dispatch, "gluon_available", lambda: False)  # another Triton, or no Hopper
    assert dispatch.fused_engine(q, swa, widx, extra, xidx, wide) == ""


def test_plan_takes_the_one_launch_bf16_loop_else_the_loop_per_cache_else_the_block_level_kernel(monkeypatch):
    """bf16 rows: "gluon-ws" over the fused chunks (K = 128 + 512 slots as one range) where
    dispatch.fused_engine applies; kernel_gluon.py per cache where only each cache on its own suits
    a Gluon loop (row strides that differ); the block-level kernel without Gluon."""
    from dsv4opt.workload.kvcache import KVLayout

    q = _FakeCudaTensor((64, 64, 512), (64 * 512, 512, 1))
    widx = _FakeCudaTensor((64, 128), (128, 1), dtype=torch.int32)
    xidx = _FakeCudaTensor((64, 512), (512, 1), dtype=torch.int32)
    layout = KVLayout(False, 448, 64, 64, 256)
    swa = KVCache(layout, _FakeCudaTensor((1 << 16, 512), (512, 1)))
    extra = KVCache(layout, _FakeCudaTensor((1 << 16, 512), (512, 1), ptr=1 << 30))
    monkeypatch.setattr(dispatch, "gluon_available", lambda: True)
    p = kernel.plan(q, swa, widx, extra, xidx)
    assert p.engine == "gluon-ws" and not p.per_cache
    assert (p.chunk, p.nsplit) == (320, 2)  # 640 slots over 2 splits of whole 64-slot tiles at B = 64
    wider = KVCache(layout, _FakeCudaTensor((1 << 16, 512), (1024, 1), ptr=1 << 30))  # another row stride
    p = kernel.plan(q, swa, widx, wider, xidx)
    # per cache: round(132 SMs / 64 programs) = 2 splits each (128 slots are 2 tiles, 512 are 8)
    assert p.engine == "gluon" and [n for _, _, n in p.per_cache] == [2, 2] and p.nsplit == 4
    monkeypatch.setattr(dispatch, "gluon_available", lambda: False)
    assert kernel.plan(q, swa, widx, extra, xidx).engine == "triton"
    fp8_swa, fp8_extra = _fp8_caches()
    assert kernel.plan(q, fp8_swa, widx, fp8_extra, xidx).engine == "triton"  # FP8 rows never take a bf16 loop


def test_extra_offsets_count_in_the_window_cache_s_data_elements():
    """The one-launch kernels read the compressed cache through the window cache's pointer: its
    offset in bytes for FP8 (uint8 data), in elements for bf16 rows, negative when it lies below."""
    from dsv4opt.workload.kvcache import KVLayout

    rows = torch.zeros(1000, 512, dtype=torch.bfloat16)
    raw = torch.zeros(1000 * 600, dtype=torch.uint8)
    idx = torch.zeros(2, 700, dtype=torch.int32)
    lengths = torch.zeros(10, dtype=torch.int32)
    bf16 = KVLayout(False, 448, 64, 64, 256)
    swa, extra = KVCache(bf16, rows[600:700]), KVCache(bf16, rows[100:500])
    got = kernel.extra_offsets(swa, idx[:, :128], lengths[2:4], extra, idx[:, 100:612], lengths[5:7])
    assert got == (-500 * 512, 100, 3, 700, 512)
    fp8 = KVLayout(True, 448, 64, 64, 64)
    swa, extra = KVCache(fp8, raw[:6000].view(10, 600)), KVCache(fp8, raw[12000:].view(-1, 600))
    assert kernel.extra_offsets(swa, idx[:, :128], lengths, extra, idx[:, 128:], lengths[4:])[0] == 12000
    assert kernel.extra_offsets(swa, idx[:, :128], lengths, None, None, None) == (0, 0, 0, 0, 0)


@on_cpu
def test_the_combine_s_split_loop_and_tile_forms_agree_with_a_torch_merge():
    """kernel.py's combine in both forms (SPLIT_LOOP for bf16 partials, the tile for fp32) against
    the merge written out in torch: weights 2^(lse_s - top), the sink in the denominator, an empty
    split (lse -inf) weighing nothing, 5 splits (not a power of two)."""
    gen = torch.Generator().manual_seed(3)
    B, S, H, D = 2, 5, 4, 64
    lse_part = torch.randn(B, S, H, generator=gen) * 3
    lse_part[0, 2] = float("-inf")
    sink = torch.randn(H, generator=gen)
    for dtype in (torch.float32, torch.float16):
        o_part = torch.randn(B, S, H, D, generator=gen).to(dtype)
        o_part[0, 2] = 0.0  # what an empty split writes
        top = torch.maximum(lse_part.amax(1), sink * kernel.LOG2E)  # [B, H], base 2
        w = torch.exp2(lse_part - top[:, None])  # [B, S, H]
        den = w.sum(1) + torch.exp2(sink * kernel.LOG2E - top)
        ref_o = (o_part.double() * w[..., None].double()).sum(1) / den[..., None].double()
        ref_lse = (top + torch.log2(den)) * kernel.LN2
        for split_loop in (False, True):
            o, lse = _combine_kernel(o_part, lse_part, sink, split_loop)
            assert torch.allclose(o.double(), ref_o, rtol=1e-5, atol=1e-6), (dtype, split_loop)
            assert torch.allclose(lse, ref_lse, rtol=1e-5, atol=1e-5), (dtype, split_loop)


@pytest.mark.parametrize("loop", ["fp8-ws", "bf16-ws"])
def test_the_gluon_launchers_pass_both_caches_through_the_window_s_pointers(monkeypatch, loop):
    """The host side of the one-launch Gluon loops, without a GPU: the kernel object is replaced by
    a recorder, so the launch arguments are checked as the kernel would get them."""
    from dsv4opt.optimizations.mma_attn import kernel_gluon_bf16_ws, kernel_gluon_fp8_ws

    module, name, launcher = {  # the module holding the kernel, its name, the launcher
        "fp8-ws": (kernel_gluon_fp8_ws, "gluon_fp8_ws_sparse_decode_kernel",
                   kernel_gluon_fp8_ws.gluon_fp8_ws_sparse_decode_partials),
        "bf16-ws": (kernel_gluon_bf16_ws, "gluon_bf16_ws_sparse_decode_kernel",
                    kernel_gluon_bf16_ws.gluon_bf16_ws_sparse_decode_partials),
    }[loop]
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda **kwargs: launches.append((grid, kwargs))

    monkeypatch.setattr(module, name, Recorder())
    x = make_inputs(AttnCase(2, 512, "all", layout="bf16" if loop.startswith("bf16") else "fp8"), "cpu", torch.bfloat16)
    o_part = torch.empty(2, 3, 64, 512, dtype=torch.bfloat16)
    lse_part = torch.empty(2, 3, 64)
    launcher(x.q, x.swa, x.swa_indices, x.swa_lengths, x.extra, x.extra_indices, x.extra_lengths, o_part, lse_part,
             3, 0.5)
    (grid, kw), = launches
    unit = x.swa.data.element_size()  # bytes of FP8 pages, elements of bf16 rows
    assert grid == (2, 1, 3) and kw["NSPLIT"] == 3 and "CHUNK" not in kw  # each split's slots: from the lengths
    assert (kw["KW"], kw["KX"]) == (128, 512) and kw["stride_ix"] == 512
    assert kw["x_delta"] * unit == x.extra.data.data_ptr() - x.swa.data.data_ptr()
    assert kw["idx_x_delta"] * 4 == x.extra_indices.data_ptr() - x.swa_indices.data_ptr()
    assert kw["len_x_delta"] * 4 == x.extra_lengths.data_ptr() - x.swa_lengths.data_ptr()
    assert kw["p_o_part"] is o_part and kw["p_lse_part"] is lse_part
    assert kw["PRODUCER_REGS_"] == kernel_gluon_fp8_ws.PRODUCER_REGS and kw["num_warps"] == 8
    if loop.startswith("bf16"):
        assert kw["stride_kv"] == 512 and kw["p_kv"] is x.swa.data


def test_the_cpu_gate_can_still_choose_the_interpreter_after_its_modules_load():
    """`dsv4opt list --check` on a CPU: the gate sets TRITON_INTERPRET=1 before the first Triton
    kernel is defined, which works only if importing the CLI and mma-attn's check leaves Triton's
    kernels unloaded (the KV cache took FP8_MAX from dsv4opt.tritonlib and `list --check` died in
    the interpreter with a traceback). Checked in a fresh interpreter without TRITON_INTERPRET."""
    import os
    import subprocess
    import sys

    code = ("import sys, dsv4opt.cli, dsv4opt.optimizations.mma_attn.check, dsv4opt.workload.kvcache\n"
            "print(sorted(m for m in sys.modules if m == 'dsv4opt.tritonlib' or m.startswith('triton.language')))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_the_cpu_gate_refuses_cleanly_once_triton_kernels_were_defined_without_the_interpreter(monkeypatch):
    import sys

    from dsv4opt.errors import DsvOptError
    from dsv4opt.optimizations.gate_table import use_interpreter

    mma_check = importlib.import_module("dsv4opt.optimizations.mma_attn.check")  # the package exports check()

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "dsv4opt.tritonlib" in sys.modules
    with pytest.raises(DsvOptError, match="TRITON_INTERPRET=1"):
        use_interpreter(("a.module.never.imported",))  # dsv4opt.tritonlib alone is enough
    with pytest.raises(DsvOptError, match="TRITON_INTERPRET=1"):
        use_interpreter(mma_check._KERNEL_MODULES)


# ---- the device's shared memory decides the tile family (fitting_plan) -----------------------------

SM120 = tritonlib.DeviceLimits("sm_120", (12, 0), 188, 101376, 102400, 65536, 1536)
SM90 = tritonlib.DeviceLimits("sm_90", (9, 0), 132, 232448, 233472, 65536, 2048)


def _fit_inputs(batch: int = 32):
    return make_inputs(AttnCase(batch, 512, "all"), "cpu", torch.float32, seed=1)


@pytest.mark.parametrize("limits, usual_needs, want", [
    (SM90, 160_000, "triton"),  # Hopper's shared memory: the families measured there
    (SM90, 240_000, "triton-chunked"),  # ... unless the launch would ask for more than the device has
    (SM120, 90_000, "triton-chunked"),  # less than Hopper's: the chunked family, even where the usual would fit
], ids=["hopper-usual", "hopper-over-limit", "small-smem"])
def test_fitting_plan_picks_the_family_by_the_devices_shared_memory(monkeypatch, limits, usual_needs, want):
    x = _fit_inputs()
    asked = []

    def needs(*args):
        p = args[9]
        asked.append(p.engine)
        return 16_384 if p.engine == "triton-chunked" else usual_needs

    monkeypatch.setattr(kernel, "_INTERPRETED", False)
    monkeypatch.setattr(kernel, "_shared_bytes", needs)
    with tritonlib.compile_only_target(limits):
        p = kernel.fitting_plan(*x.args())
    assert p.engine == want
    if want == "triton-chunked":
        assert (p.tiles.block_d, p.tiles.block_v) == (kernel.CHUNKED_TILES["block_d"], kernel.CHUNKED_TILES["block_v"])
        assert p.tiles.block_d < x.q.shape[-1]
    assert asked[-1] == want and ("triton" in asked) == (limits is SM90)


def test_fitting_plan_refuses_in_one_line_where_no_tiles_fit(monkeypatch):
    x = _fit_inputs(batch=4)
    monkeypatch.setattr(kernel, "_INTERPRETED", False)
    monkeypatch.setattr(kernel, "_shared_bytes", lambda *a: 120_000)
    with tritonlib.compile_only_target(SM120), pytest.raises(DsvOptError) as err:
        kernel.fitting_plan(*x.args())
    msg = str(err.value)
    assert "\n" not in msg and "101,376 B" in msg and "120,000 B" in msg and "B = 4" in msg and "mma-attn off" in msg


def test_mma_attention_with_tiles_given_skips_the_fit(monkeypatch):
    """Explicit tiles run as given (the tests' and the bench's variants); only planned tiles are fitted."""
    x = _fit_inputs(batch=1)
    monkeypatch.setattr(kernel, "fitting_plan", lambda *a, **k: pytest.fail("fitted explicit tiles"))
    monkeypatch.setattr(kernel, "_launch_fused", lambda *a, **k: None)
    monkeypatch.setattr(kernel, "combine_splits", lambda *a, **k: None)
    kernel.mma_attention(*x.args(), tiles=kernel.Tiles(16, 32, 2, 4, 1))


def test_chunked_tiles_take_the_latent_in_chunks_and_split_the_values():
    t = kernel.choose_tiles(32, 64, 640, torch.device("cpu"), fp8=True, chunked=True)
    assert t.block_h == 64 and t.block_d == 64 and t.block_v == 128 and t.reload_v and t.num_stages == 1
    # a latent no wider than a chunk is taken whole
    assert kernel.choose_tiles(1, 8, 100, torch.device("cpu"), dim=64, chunked=True).block_d == 0


def test_gluon_loops_are_off_where_shared_memory_is_capped(monkeypatch):
    """DSV4OPT_SHARED_MEMORY_LIMIT makes a Hopper card a 99 KB GPU for every tile table: the Gluon
    loops (tiled for Hopper's shared memory) say why they are off."""
    monkeypatch.setattr(dispatch, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dispatch.triton, "__version__", dispatch.GLUON_VALIDATED_TRITON[0] + "0")
    dispatch.gluon_unavailable_reason.cache_clear()
    try:
        with tritonlib.compile_only_target(replace(SM90, shared_per_block=101376)):
            reason = dispatch.gluon_unavailable_reason()
        assert reason.startswith("101,376 B of shared memory a block"), reason
        dispatch.gluon_unavailable_reason.cache_clear()
        with tritonlib.compile_only_target(SM90):
            assert dispatch.gluon_unavailable_reason() == ""
    finally:
        dispatch.gluon_unavailable_reason.cache_clear()


@needs_gpu
def test_full_table_on_gpu_as_a_99_kb_gpu_runs_it(monkeypatch):
    """The chunked family on every case of the gate's table (float64 reference, NaN-poisoned), as a
    GPU with sm_120's 101,376 B of shared memory a block runs it: the card capped to that."""
    monkeypatch.setenv(tritonlib.SHARED_LIMIT_ENV, "101376")
    dispatch.gluon_unavailable_reason.cache_clear()
    try:
        result = check_module.check("cuda")
    finally:
        dispatch.gluon_unavailable_reason.cache_clear()
    assert result.passed, result.summary
    assert {r["engine"] for r in result.details["cases"]} == {"triton-chunked"}
