"""`dsv4opt bench mma-attn`: mma-attn against the floor, SGLang's sm_120 path and a torch path, and
(bench_peers.py) beside the FlashMLA SGLang 0.5.23 ships and FlashMLA built from source.

Runs the correctness gate first; when it fails, nothing is timed and no speed-up is printed.
Then the graph-width case (`graph_width_rows`): SGLang's baseline kernel and mma-attn on HCA-like
rows sized as SGLang's CUDA-graph decode sizes them, against the same used slots in narrow rows.
Times are medians of CUDA-graph replays; the KV pool is much larger than L2, each request selects
distinct random rows, and consecutive calls cycle through enough independent input sets that what
one call reads is out of L2 by the time the set comes round again (a replay of the same indices
would otherwise find a B = 32 call's 21 MB of rows still in L2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.optimizations import timing
from dsv4opt.optimizations.timing import L2_SPAN, MAX_SETS, BenchOptions, copy_bandwidth_gbps, median_graph_ms, sets_needed  # noqa: F401
from dsv4opt.optimizations.mma_attn.bench_inputs import (  # noqa: F401  (the benchmarks/ scripts read them here)
    DIM, EXTRA_PAGE, HEADS, POOL_GB, ROPE, TILE, TOPK, WINDOW, WINDOW_PAGE, bench_inputs, input_sets, pool_cache,
    rotating, window_cache,
)
from dsv4opt.workload.config import ModelConfig

_CFG = ModelConfig.from_name("dsv4-flash")
BATCHES = (1, 16, 32, 64)
_median_graph_ms = median_graph_ms
# The graph-width case: SGLang's CUDA-graph decode sizes the HCA layers' compressed-cache index
# rows to context_len / 128 (1,048,576 / 128 = 8192 slots at the model's maximum context, the
# recipe's default); at an 8K context 64 of them are used. The same 64 used slots in rows 128 wide
# beside them show whether a kernel's time follows the used slots or the rows' width.
GRAPH_BATCHES = (1, 32, 64)
GRAPH_WIDTHS = (128, 1_048_576 // _CFG.hca_ratio)
GRAPH_USED = 64


@dataclass(frozen=True)
class BenchRow:
    batch: int
    tiles: str
    mma_us: float
    bytes_moved: int  # unique KV rows + q + o
    floor_us: float  # bytes_moved over the copy bandwidth measured in this run
    flop_floor_us: float  # QK and PV FLOPs over the bf16 matmul rate measured in this run
    achieved_gbps: float
    frac_copy_bw: float
    baseline_us: float  # SGLang's sm_120 path: two CUDA-core kernel calls, eager merge and sink
    torch_us: float
    speedup_vs_baseline: float
    speedup_vs_torch: float
    input_sets: int = 1  # independent input sets the timed calls cycle through


@dataclass(frozen=True)
class GraphWidthRow:
    """One batch size at one row width: both kernels over `used` compressed slots a request (plus
    the full window) in rows `width` slots wide, -1 past the used ones as SGLang's metadata has it."""

    batch: int
    width: int  # compressed-cache slots a row
    used: int  # of them used per request (lengths)
    main_loop: str  # mma-attn's engine
    baseline_us: float  # SGLang's sm_120 path (dsv4opt/workload/attention/sm120.py over simt.py)
    mma_us: float
    baseline_ns_per_slot: float  # per used slot of the call: B x (used + window)
    mma_ns_per_slot: float
    input_sets: int = 1


@dataclass
class BenchResult(timing.BenchResult):
    matmul_tflops: float = 0.0
    rows: list[BenchRow] = field(default_factory=list)
    kv: str = "fp8"
    graph_rows: list[GraphWidthRow] = field(default_factory=list)
    peers: object = None  # bench_peers.PeerResult: beside FlashMLA on the same inputs (FP8 cache)

    def as_json(self) -> dict:
        check = self.check_json()
        return {
            "bench": "mma-attn",
            "device": self.device,
            "shape": {"heads": HEADS, "dim": DIM, "topk": TOPK, "window": WINDOW, "kv": self.kv},
            "copy_gbps": self.copy_gbps,
            "matmul_tflops": self.matmul_tflops,
            "check": check,
            "rows": [asdict(r) for r in self.rows],
            "graph_width": [asdict(r) for r in self.graph_rows],
            **({"peers": self.peers.as_json()} if self.peers is not None else {}),
        }


def matmul_tflops(n: int = 8192) -> float:
    """bf16 matrix product on random data: the tensor-core ceiling for the FLOP floor."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()  # the timing runs on a stream of its own
    ms = _median_graph_ms(lambda: a @ b)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def graph_inputs(batch: int, width: int, used: int, swa, extra, gen: torch.Generator):
    """bench_inputs' window, and compressed-cache rows `width` wide of which the first `used` hold
    distinct random tokens and the rest -1 (SGLang's graph-width metadata), lengths `used`."""
    q, swa_idx, swa_len, idx, _, sink = bench_inputs(batch, swa, extra, gen)
    rows = torch.full((batch, width), -1, device="cuda", dtype=torch.int32)
    rows[:, :used] = idx[:, :used]
    return q, swa_idx, swa_len, rows, torch.full((batch,), used, device="cuda", dtype=torch.int32), sink


def graph_width_rows(batches: Sequence[int], swa_for: Callable[[int], object], extra, gen: torch.Generator,
                     widths: Sequence[int] = GRAPH_WIDTHS, used: int = GRAPH_USED,
                     on_step: Callable[[str], None] = lambda _msg: None) -> list[GraphWidthRow]:
    """Time SGLang's baseline kernel and mma-attn at each batch size and row width, in the same run
    (CUDA-graph medians, input sets rotated as in run_bench, sized by the used slots' bytes)."""
    from dsv4opt.optimizations.mma_attn.kernel import fitting_plan, mma_attention
    from dsv4opt.workload.attention import sparse_decode_sm120

    rows, scale = [], DIM**-0.5
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    for batch in batches:
        swa = swa_for(batch)
        for width in widths:
            on_step(f"graph width: B = {batch}, rows {width} wide, {used} used")
            per_call = batch * (used + WINDOW) * extra.layout.token_bytes
            sets = [graph_inputs(batch, width, used, swa, extra, gen) for _ in range(sets_needed(per_call, l2_bytes))]
            torch.cuda.synchronize()  # as input_sets: the timing stream does not wait for randperm
            base_ms = _median_graph_ms(rotating(sparse_decode_sm120, swa, extra, sets, scale))
            mma_ms = _median_graph_ms(rotating(mma_attention, swa, extra, sets, scale))
            q, swa_idx, swa_len, idx, lengths, sink = sets[0]
            slots = batch * (used + WINDOW)
            engine = fitting_plan(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale).engine
            rows.append(GraphWidthRow(
                batch=batch, width=width, used=used, main_loop=engine,
                baseline_us=base_ms * 1e3, mma_us=mma_ms * 1e3, baseline_ns_per_slot=base_ms * 1e6 / slots,
                mma_ns_per_slot=mma_ms * 1e6 / slots, input_sets=len(sets),
            ))
            del sets
    return rows


def torch_path(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale):
    """The plain-torch path over both caches, merged and sunk the way the baseline does it."""
    from dsv4opt.workload.attention.sm120 import apply_sink, merge_partials
    from dsv4opt.workload.attention.torch_path import sparse_decode_torch

    o1, l1 = sparse_decode_torch(q, swa, swa_idx, swa_len, scale)
    o2, l2 = sparse_decode_torch(q, extra, idx, lengths, scale)
    return apply_sink(*merge_partials(o1, l1, o2, l2), sink)


def run_bench(options: BenchOptions = BenchOptions(), *, pool_gb: float = POOL_GB,
              graph_batches: Sequence[int] = GRAPH_BATCHES) -> BenchResult:
    """Check, then time mma-attn, the baseline and the torch path for each batch size
    (options.batches, on the options.kv cache); then the graph-width case at `graph_batches` (none:
    skipped); then, on the FP8 cache, mma-attn beside FlashMLA on the same inputs (bench_peers.run_peers)."""
    batches, kv, on_step = options.batches or BATCHES, options.kv, options.on_step
    if not torch.cuda.is_available():
        raise DsvOptError("dsv4opt bench mma-attn needs a CUDA GPU (on a CPU only the correctness check runs, under Triton's interpreter)")
    if kv not in ("fp8", "bf16"):
        raise DsvOptError(f"--kv must be fp8 or bf16, not {kv!r}")
    from dsv4opt.optimizations.mma_attn.check import check
    from dsv4opt.optimizations.mma_attn.kernel import fitting_plan, mma_attention
    from dsv4opt.workload.attention import sparse_decode_sm120

    on_step("correctness check")
    result = BenchResult(check=check("cuda"), device=torch.cuda.get_device_name(), kv=kv)
    if not result.check.passed:
        return result
    on_step("copy bandwidth and matmul rate")
    result.copy_gbps = copy_bandwidth_gbps()
    result.matmul_tflops = matmul_tflops()
    gen = torch.Generator(device="cuda").manual_seed(0)
    extra = pool_cache(kv, gen, pool_gb)
    scale = DIM**-0.5
    for batch in batches:
        on_step(f"B = {batch}")
        swa = window_cache(kv, batch, gen)
        sets = input_sets(batch, swa, extra, gen)
        mma_ms = _median_graph_ms(rotating(mma_attention, swa, extra, sets, scale))
        base_ms = _median_graph_ms(rotating(sparse_decode_sm120, swa, extra, sets, scale))
        torch_ms = _median_graph_ms(rotating(torch_path, swa, extra, sets, scale))
        q, swa_idx, swa_len, idx, lengths, sink = sets[0]
        p = fitting_plan(q, swa, swa_idx, swa_len, extra, idx, lengths, sink, scale)
        unique = int(torch.unique(swa_idx).numel()) + int(torch.unique(idx).numel())
        moved = unique * extra.layout.token_bytes + 2 * q.numel() * q.element_size()
        flops = 2 * 2 * batch * HEADS * (TOPK + WINDOW) * DIM
        gbps = moved / (mma_ms * 1e-3) / 1e9
        result.rows.append(
            BenchRow(
                batch=batch,
                tiles=f"{p.engine} {str(p.tiles).removeprefix('Tiles')}",
                mma_us=mma_ms * 1e3,
                bytes_moved=moved,
                floor_us=moved / (result.copy_gbps * 1e9) * 1e6,
                flop_floor_us=flops / (result.matmul_tflops * 1e12) * 1e6,
                achieved_gbps=gbps,
                frac_copy_bw=gbps / result.copy_gbps,
                baseline_us=base_ms * 1e3,
                torch_us=torch_ms * 1e3,
                speedup_vs_baseline=base_ms / mma_ms,
                speedup_vs_torch=torch_ms / mma_ms,
                input_sets=len(sets),
            )
        )
        del sets
    result.graph_rows = graph_width_rows(graph_batches, lambda b: window_cache(kv, b, gen), extra, gen, on_step=on_step)
    if kv == "fp8":
        from dsv4opt.optimizations.mma_attn.bench_peers import run_peers

        result.peers = run_peers(batches, extra, gen, scale, on_step)
    return result


def render(result: BenchResult):
    """A rich table of the rows (or of the failed check), each row's launch configuration under it;
    the graph-width table under it where that case ran, and FlashMLA's beside mma-attn (bench_peers)."""
    from dsv4opt.display import narrow_table

    parts = [_render_rows(result, narrow_table)]
    if result.check.passed and result.graph_rows:
        parts += ["", render_graph_width(result.graph_rows, result.kv)]
    if result.check.passed and result.peers is not None:
        from dsv4opt.optimizations.mma_attn.bench_peers import render as render_peers

        parts += ["", render_peers(result.peers)]
    if len(parts) == 1:
        return parts[0]
    from rich.console import Group

    return Group(*parts)


def render_graph_width(rows: Sequence[GraphWidthRow], kv: str):
    """Both kernels at each row width, with the time per used slot and the ratio to the narrowest
    rows' time at the same B: a kernel whose ratio stays near 1 pays for the used slots."""
    from dsv4opt.display import narrow_table

    narrowest = {}
    for r in rows:
        if r.batch not in narrowest or r.width < narrowest[r.batch].width:
            narrowest[r.batch] = r
    used = sorted({r.used for r in rows})
    table = narrow_table(
        f"graph width: HCA-like rows, {'/'.join(map(str, used))} of the compressed slots used + window {WINDOW}, "
        f"{kv} KV", padding=0,
        caption="ns/slot: per used slot of the call, B x (used + window); x narrow: time over the same B's "
                "narrowest rows", caption_justify="left",
    )
    for col in ("B", "row\nslots", "mma-attn\nloop", "SGLang\nµs", "SGLang\nns/slot", "x\nnarrow", "mma\nµs",
                "mma\nns/slot", "x\nnarrow", "x\nSGLang"):
        table.add_column(col, justify="left" if col.endswith("loop") else "right", no_wrap=True)
    for r in rows:
        base = narrowest[r.batch]
        table.add_row(str(r.batch), str(r.width), r.main_loop, f"{r.baseline_us:.1f}", f"{r.baseline_ns_per_slot:.2f}",
                      f"{r.baseline_us / base.baseline_us:.1f}", f"{r.mma_us:.1f}", f"{r.mma_ns_per_slot:.3f}",
                      f"{r.mma_us / base.mma_us:.2f}", f"{r.baseline_us / r.mma_us:.0f}")
    return table


def _render_rows(result: BenchResult, narrow_table):
    if not result.check.passed:
        from dsv4opt.optimizations.gate_table import failed_table

        return failed_table("mma-attn", result.check, ("rel_err_o", "rel_err_lse"))
    table = narrow_table(
        f"mma-attn on {result.device}: H {HEADS}, D {DIM}, K {TOPK} + window {WINDOW}, {result.kv} KV; "
        f"copy {result.copy_gbps:.0f} GB/s, matmul {result.matmul_tflops:.0f} TFLOP/s", padding=0,
        caption=f"check: {result.check.summary}\n" + "\n".join(f"B = {r.batch}: {r.tiles}" for r in result.rows),
        caption_justify="left",
    )
    # The launch configuration goes under the table: in a column it took half of the width, and
    # the box's blank separators are the only gaps between columns, so 80 columns hold them all.
    for col in ("B", "main loop", "µs", "floor\nµs", "FLOP\nfloor µs", "of roof-\nline", "of copy\nbw",
                "SGLang\nµs", "x\nSGLang", "torch\nµs", "x\ntorch"):
        table.add_column(col, justify="left" if col == "main loop" else "right", no_wrap=True)
    for r in result.rows:
        roofline = max(r.floor_us, r.flop_floor_us)
        table.add_row(
            str(r.batch), r.tiles.split(" ", 1)[0], f"{r.mma_us:.1f}", f"{r.floor_us:.1f}", f"{r.flop_floor_us:.1f}",
            f"{roofline / r.mma_us:.1%}", f"{r.frac_copy_bw:.1%}", f"{r.baseline_us:.1f}",
            f"{r.speedup_vs_baseline:.1f}", f"{r.torch_us:.1f}", f"{r.speedup_vs_torch:.1f}",
        )
    return table
