"""`dsv4opt bench indexer-topk`: one CSA layer's indexer scores and top-k at dsv4-flash widths.

Runs the correctness gate first; when it fails, nothing is timed. Then, per context (8192 tokens,
2048 entries a request, the profile's default; 131072 tokens, 32768 entries) and concurrency C:
- ours: the `indexer_topk` slot of indexer-topk as `auto` runs it, and each mode (fused, split);
- stand-in: the Hopper path's baseline slot, the stand-in for DeepGEMM's `fp8_paged_mqa_logits`
  (kernels/indexer_tc.py, FP8 operands) over the page table's width, then topk_transform;
- DeepGEMM: `fp8_paged_mqa_logits` itself (clean_logits False; its schedule made once outside the
  timed call, as SGLang makes it once a step for all 21 layers) then topk_transform, where
  workload/production/deepgemm.py can run (Hopper, `dsv4opt build-kernels`). SGLang's own top-k
  (topk_transform_paged_v2, a JIT kernel) is not built here: topk_transform stands in for it.
Page tables are as wide as SGLang's decode graph (the model's context: 4096 pages of 64 entries),
past a request's own pages page 0. Times are medians of CUDA-graph replays over rotating input
sets, as many as make the keys they read three times the L2 (timing.sets_needed). The floor is the
bytes the slot must move (queries, head weights, every scored key with its scale, the indices)
over the copy bandwidth measured in the run; bytes and launches of each: docs/optimizations/indexer-topk.md.

    python -m dsv4opt.optimizations.indexer_topk.bench [--concurrency 1,16,32,64] [--context 8192,131072] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.fileio import finite
from dsv4opt.optimizations import timing
from dsv4opt.optimizations.timing import BenchOptions
from dsv4opt.workload.config import ModelConfig

CFG = ModelConfig.from_name("dsv4-flash")
CONCURRENCIES = (1, 16, 32, 64)
CONTEXTS = (8192, 131072)
FP32, INT32 = 4, 4
DEEPGEMM_SPLIT = 256  # entries a DeepGEMM task covers (4 warp groups x BLOCK_KV 64): it writes rows to there


def graph_width_pages(cfg: ModelConfig = CFG) -> int:
    """Pages of SGLang's decode-graph page table: the model's context in 64-entry index pages."""
    return -(-cfg.max_context // (cfg.index_page * cfg.csa_ratio))


def bytes_moved(cfg: ModelConfig, lengths: Sequence[int], width: int) -> dict[str, int]:
    """Bytes one CSA layer's indexer scores and top-k move, by who moves them (width: the page
    table's entries). `floor`: what any implementation must (queries and head weights, each scored
    key and its scale, the indices out); `sglang_rows`: DeepGEMM's logit rows written up to its
    256-entry split and read back to each length by the top-k; `claimed_rows`: the whole [C, width]
    row written and read; `stand_in_rows`: what the stand-in writes (every row to its width)."""
    B, H, D, k = len(lengths), cfg.index_heads, cfg.index_dim, cfg.index_topk
    floor = B * H * (D + FP32) + sum(lengths) * (D + FP32) + B * k * INT32
    return {
        "floor": floor,
        "sglang_rows": sum((-(-n // DEEPGEMM_SPLIT) * DEEPGEMM_SPLIT + n) * FP32 for n in lengths),
        "claimed_rows": 2 * B * width * FP32,
        "stand_in_rows": B * width * FP32 + sum(lengths) * FP32,
    }


@dataclass(frozen=True)
class BenchRow:
    context: int
    concurrency: int
    entries: int  # a request's compressed entries
    sets: int  # rotating input sets
    floor_us: float
    ours_us: float  # auto
    mode: str  # what auto ran
    fused_us: float
    split_us: float
    frac_floor: float
    stand_in_us: float
    speedup_vs_stand_in: float
    deepgemm_us: float | None = None  # DeepGEMM's logits, then topk_transform
    deepgemm_logits_us: float | None = None  # DeepGEMM's logits alone
    speedup_vs_deepgemm: float | None = None
    agree_stand_in: float = 1.0  # mean fraction of ours kept by the stand-in too (first set)
    agree_deepgemm: float | None = None


@dataclass
class BenchResult(timing.BenchResult):
    deepgemm: str = "not tried"  # what happened to DeepGEMM
    rows: list[BenchRow] = field(default_factory=list)

    def as_json(self) -> dict:
        return finite({"bench": "indexer-topk", "device": self.device, "copy_gbps": self.copy_gbps,
                        "deepgemm": self.deepgemm, "heads": CFG.index_heads, "dim": CFG.index_dim,
                        "topk": CFG.index_topk, "graph_width_pages": graph_width_pages(),
                        "check": self.check_json(), "rows": [asdict(r) for r in self.rows]})


def input_set(concurrency: int, entries: int, width_pages: int, gen: torch.Generator, device="cuda") -> dict:
    """One call's arguments at dsv4-flash widths: C requests of `entries` entries, each in its own
    pages of a fresh cache (page 0 a spare), the page table `width_pages` wide."""
    from dsv4opt.workload.kvcache import IndexKeyCache, quantize_index_key

    H, D, page = CFG.index_heads, CFG.index_dim, CFG.index_page
    own = -(-entries // page)
    cache = IndexKeyCache.allocate(D, page, 1 + concurrency * own, device)
    cache.fill_random(torch.Generator(device=device).manual_seed(int(torch.randint(1 << 30, (1,), generator=gen))))
    q8, q_scale = quantize_index_key(torch.randn(concurrency * H, D, generator=gen).to(device))
    weights = torch.randn(concurrency, H, generator=gen).to(device) * (H * D) ** -0.5 * q_scale.view(concurrency, H)
    j = torch.arange(width_pages, device=device)[None, :]
    rows = torch.arange(concurrency, device=device)[:, None]
    table = torch.where(j < own, 1 + rows * own + j, 0).int()
    return {"q8": q8.view(concurrency, H, D), "weights": weights, "cache": cache,
            "seq_lens": torch.full((concurrency,), entries, dtype=torch.int32, device=device), "page_table": table,
            "base": (torch.arange(concurrency, device=device) * own * page).int()}


def _args(s: dict) -> tuple:
    return s["q8"], s["weights"], s["cache"], s["seq_lens"], s["page_table"], s["base"], CFG.index_topk


def _rotating(fn: Callable, sets: list[dict]) -> Callable[[], object]:
    cycle = itertools.cycle(sets)
    return lambda: fn(next(cycle))


def _time(fn) -> float:
    """µs per call, median of CUDA-graph replays, after one eager call (JIT compiles happen there)."""
    fn()
    torch.cuda.synchronize()
    return timing.median_graph_ms(fn) * 1e3


def _agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over requests of |a & b| / |a| for two [B, k] index tensors (-1 ignored)."""
    fractions = []
    for x, y in zip(a.cpu().tolist(), b.cpu().tolist()):
        mine = {v for v in x if v >= 0}
        fractions.append(len(mine & {v for v in y if v >= 0}) / max(1, len(mine)))
    return sum(fractions) / max(1, len(fractions))


def _deepgemm() -> tuple[object | None, str]:
    """production/deepgemm.py when it can run here, else None and why (one line)."""
    from dsv4opt.workload.production import artefacts

    (row,) = [a for a in artefacts.availability() if a.family.key == artefacts.DEEPGEMM]
    if not row.ready:
        return None, row.line()
    try:
        from dsv4opt.workload.production import deepgemm

        deepgemm.load()
    except Exception as exc:  # noqa: BLE001  (a failed build or load is reported, the rest still timed)
        return None, f"did not load: {type(exc).__name__}: {str(exc)[:120]}"
    return deepgemm, "DeepGEMM's fp8_paged_mqa_logits (vllm 0.23.0's 2.5.0)"


def run_bench(options: BenchOptions = BenchOptions(), *, contexts: Sequence[int] = CONTEXTS) -> BenchResult:
    """Check, then time indexer-topk, the stand-in and DeepGEMM at each context and concurrency."""
    if not torch.cuda.is_available():
        raise DsvOptError("dsv4opt bench indexer-topk needs a CUDA GPU (on a CPU only its correctness gate runs, "
                          "under Triton's interpreter: TRITON_INTERPRET=1 dsv4opt list --check)")
    from dsv4opt.optimizations.indexer_topk.check import check
    from dsv4opt.optimizations.indexer_topk.kernel import choose_mode, indexer_topk
    from dsv4opt.workload.baseline import hopper_0523
    from dsv4opt.workload.kernels.indexer import topk_transform

    concurrencies, on_step = tuple(options.batches or CONCURRENCIES), options.on_step
    on_step("correctness check")
    result = BenchResult(check=check("cuda"), device=torch.cuda.get_device_name())
    if not result.check.passed:
        return result
    on_step("copy bandwidth")
    result.copy_gbps = timing.copy_bandwidth_gbps()
    dg, result.deepgemm = _deepgemm()
    path = hopper_0523()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    gen = torch.Generator().manual_seed(0)
    width_pages = graph_width_pages()

    def stand_in(s):
        return path["indexer_topk"](*_args(s), path["indexer_logits"])

    def ours(mode):
        return lambda s: indexer_topk(*_args(s), mode=mode)

    for context, c in itertools.product(contexts, concurrencies):
        on_step(f"context {context} C = {c}")
        entries = context // CFG.csa_ratio
        moved = bytes_moved(CFG, [entries] * c, width_pages * CFG.index_page)
        sets = [input_set(c, entries, width_pages, gen)]
        sets += [input_set(c, entries, width_pages, gen) for _ in range(timing.sets_needed(moved["floor"], l2) - 1)]
        floor_us = moved["floor"] / (result.copy_gbps * 1e9) * 1e6
        times = {m: _time(_rotating(ours(m), sets)) for m in ("auto", "fused", "split")}
        base_us = _time(_rotating(stand_in, sets))
        first = sets[0]
        mine = indexer_topk(*_args(first))
        row = dict(context=context, concurrency=c, entries=entries, sets=len(sets), floor_us=floor_us,
                   ours_us=times["auto"], mode=choose_mode(c, first["q8"].device), fused_us=times["fused"],
                   split_us=times["split"], frac_floor=floor_us / times["auto"], stand_in_us=base_us,
                   speedup_vs_stand_in=base_us / times["auto"], agree_stand_in=_agreement(mine, stand_in(first)))
        if dg is not None:
            for s in sets:  # once a step in SGLang, shared by its 21 CSA layers: made outside the timing
                s["schedule"] = dg.paged_mqa_schedule(s["seq_lens"], CFG.index_page)
            width = width_pages * CFG.index_page

            def dg_logits(s):
                return dg.paged_mqa_logits(s["q8"], s["weights"], s["cache"], s["seq_lens"], s["page_table"], width,
                                           s["schedule"])

            def dg_topk(s):
                return topk_transform(dg_logits(s), s["seq_lens"], s["base"], CFG.index_topk)

            try:
                dg_us = _time(_rotating(dg_topk, sets))
                row.update(deepgemm_us=dg_us, deepgemm_logits_us=_time(_rotating(dg_logits, sets)),
                           speedup_vs_deepgemm=dg_us / times["auto"], agree_deepgemm=_agreement(mine, dg_topk(first)))
            except Exception as exc:  # noqa: BLE001  (reported, and not tried again)
                result.deepgemm, dg = f"failed at context {context} C = {c}: {type(exc).__name__}: {str(exc)[:120]}", None
        result.rows.append(BenchRow(**row))
        del sets
        torch.cuda.empty_cache()
    return result


def render(result: BenchResult):
    """A rich table of the rows (or of the failed check), the check and DeepGEMM's status under it."""
    from dsv4opt.display import narrow_table

    if not result.check.passed:
        from dsv4opt.optimizations.gate_table import failed_table

        return failed_table("indexer-topk", result.check, ("unexplained", "malformed", "score_err"))
    caption = (f"ours: auto (its mode), fused, split; base: the Hopper stand-in (graph-wide logits + topk_transform); "
               f"dg: DeepGEMM's logits + topk_transform; x: their time over ours; agree: share of our top-k the other "
               f"keeps\ncheck: {result.check.summary}\nDeepGEMM: {result.deepgemm}")
    table = narrow_table(f"indexer-topk on {result.device}: {CFG.index_heads} x {CFG.index_dim}, top-"
                         f"{CFG.index_topk}, graph width {graph_width_pages()} pages, copy {result.copy_gbps:.0f} GB/s",
                         caption=caption, caption_justify="left")
    for col in ("ctx", "C", "floor\nµs", "ours\nµs", "mode", "fused\nµs", "split\nµs", "base\nµs", "x\nbase", "dg\nµs",
                "x\ndg", "agree"):
        table.add_column(col, justify="right", no_wrap=True)

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in result.rows:
        agree = min(r.agree_stand_in, r.agree_deepgemm if r.agree_deepgemm is not None else 1.0)
        table.add_row(f"{r.context // 1024}K", str(r.concurrency), f"{r.floor_us:.1f}", f"{r.ours_us:.1f}", r.mode,
                      f"{r.fused_us:.1f}", f"{r.split_us:.1f}", f"{r.stand_in_us:.1f}", f"{r.speedup_vs_stand_in:.2f}",
                      f(r.deepgemm_us, ".1f"), f(r.speedup_vs_deepgemm, ".2f"), f"{agree:.3f}")
    return table


def main(argv: Sequence[str] | None = None) -> None:
    from rich.console import Console

    from dsv4opt.fileio import check_new_file, write_json_atomic

    ap = argparse.ArgumentParser(prog="python -m dsv4opt.optimizations.indexer_topk.bench")
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCIES)))
    ap.add_argument("--context", default=",".join(map(str, CONTEXTS)), help="tokens a request holds")
    ap.add_argument("--json", help="also write the results here (refused if it exists)")
    args = ap.parse_args(argv)
    console = Console()
    try:
        conc = tuple(int(v) for v in args.concurrency.split(",") if v)
        contexts = tuple(int(v) for v in args.context.split(",") if v)
    except ValueError:
        raise SystemExit("--concurrency and --context take comma-separated whole numbers") from None
    try:
        check_new_file(args.json, False, "--json")
        result = run_bench(BenchOptions(batches=conc, on_step=lambda m: console.print(f"[dim]{m}[/dim]")),
                           contexts=contexts)
    except DsvOptError as err:
        console.print(f"[red]{err}[/red]")
        raise SystemExit(1) from None
    console.print(render(result))
    if args.json:
        write_json_atomic(args.json, result.as_json(), make_dirs=False)
    if not result.check.passed:
        raise SystemExit(1)



if __name__ == "__main__":
    main()
