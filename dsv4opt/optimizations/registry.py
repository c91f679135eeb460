"""The optimisations dsv4opt knows: what each targets, replaces and risks, and how to check it.

Entries are data; the kernel code is imported only when an optimisation is used, so listing them
costs nothing and works without a GPU. An optimisation is one package (`module`) exporting
IMPLEMENTATIONS (slot -> callable) and check(device); a `bench` submodule, when it has one, is its
benchmark (run_bench, render; `dsv4opt bench NAME`). Adding one is a package and a `register` call:
list, apply, revert, bench, the env gate and the tests find it through this registry.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from dsv4opt.errors import DsvOptError, unknown_name


@dataclass(frozen=True)
class CheckResult:
    """What a correctness gate measured. `figures` and `bounds` share keys where a bound applies."""

    name: str
    passed: bool
    device: str
    figures: dict[str, float]
    bounds: dict[str, float]
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # lines printed under the summary: what ran, and why not something else


@dataclass(frozen=True)
class Optimization:
    name: str
    target_category: str
    replaces: str  # what it replaces, in words
    slots: tuple[str, ...]  # workload slots (dsv4opt.workload.slots.SLOTS) it provides
    env_gate: str
    risk: str  # one phrase
    changes_selection: bool  # changes numerics that decide which tokens attention sees
    needs_graph: bool  # must be CUDA-graph safe to help (decode replays graphs)
    module: str  # package exporting IMPLEMENTATIONS (slot -> callable) and check(device)
    devices: tuple[str, ...] = ("cuda", "cpu")  # where its implementations run in the workload
    model: str = "deepseek-v4"  # the model family its kernels are written for
    target_kernels: str | None = None  # substring a target kernel's name has when this is what it replaces
    fuses_all_glue: bool = False  # a glue optimisation that works on every region (not only those it names)
    # The workload parts its slots run in (dsv4opt.workload.model.PARTS, the profile's record_function
    # ranges): a slot replaces all the baseline launched there, whatever category each launch is filed under.
    parts: tuple[str, ...] = ()
    # recommend proposes it only where a speed-up measured on the profile's SGLang path is on record
    # (measured.json): where its parts hold kernels it does not replace, their bound overstates it.
    needs_measurement: bool = False

    def implementations(self) -> dict[str, Callable]:
        return dict(importlib.import_module(self.module).IMPLEMENTATIONS)

    def check(self, device: str | None = None) -> CheckResult:
        return importlib.import_module(self.module).check(device)

    def replaced_functions(self) -> tuple[str, ...]:
        """Names of the baseline functions it replaces (the package's REPLACES when it names them,
        else its slots' baseline implementations): what a profile's source sites show for the glue
        an optimisation of glue fuses."""
        names = getattr(importlib.import_module(self.module), "REPLACES", None)
        if names is not None:
            return tuple(names)
        from dsv4opt.workload.baseline import IMPLEMENTATIONS as BASELINE

        return tuple(BASELINE[slot].__name__ for slot in self.slots)

    @property
    def bench_module(self) -> str | None:
        """The package's benchmark module, if it has one: found as a file beside the package's, so
        asking imports only the package's parent (for ours dsv4opt.optimizations, which is light),
        never the package and its kernels."""
        parent, _, leaf = self.module.rpartition(".")
        try:
            spec = importlib.util.find_spec(parent) if parent else None
        except ModuleNotFoundError:
            return None
        places = (spec.submodule_search_locations or []) if spec is not None else []
        return f"{self.module}.bench" if any((Path(p) / leaf / "bench.py").is_file() for p in places) else None


OPTIMIZATIONS: dict[str, Optimization] = {
    o.name: o
    for o in (
        Optimization(
            name="mma-attn",
            target_category="attention",
            replaces="CUDA-core sparse-MLA decode kernel, one program per (request, head)",
            slots=("attention",),
            env_gate="DSV4OPT_MMA_ATTN",
            risk="new kernel; bf16 rounding in attention only, token selection unchanged",
            changes_selection=False,
            needs_graph=True,
            module="dsv4opt.optimizations.mma_attn",
            devices=("cuda",),
            parts=("attn",),
        ),
        Optimization(
            name="bf16-gemm",
            target_category="gemm_fp32_simt",
            replaces="float32 indexer logits (torch fallback, fp32 bmm) and hyper-connection pre-mix linear",
            slots=("indexer_logits", "hc_premix"),
            env_gate="DSV4OPT_BF16_GEMM",
            risk="bf16 indexer scores can change which top-k entries are selected",
            changes_selection=True,
            needs_graph=False,
            module="dsv4opt.optimizations.bf16_gemm",
            parts=("indexer", "mhc_pre"),
        ),
        Optimization(
            name="fuse-glue",
            target_category="glue",
            replaces="eager glue between kernels (hyper-connection split and sum, local-expert map, the per-slot "
                     "MoE path's set-up, activation and combine): one Triton launch per region",
            slots=("hc_split_sum", "moe_local", "routed_experts"),
            env_gate="DSV4OPT_FUSE_GLUE",
            risk="new kernels; one rounding per region instead of several, token selection unchanged",
            changes_selection=False,
            needs_graph=True,
            module="dsv4opt.optimizations.fuse_glue",
            parts=("mhc_pre", "moe"),
        ),
        # After fuse-glue: with both on, the routed experts are grouped-moe's (later wins).
        Optimization(
            name="grouped-moe",
            target_category="moe",
            replaces="SGLang's sm_120 MXFP4 fallback: two CUDA-core GEMVs per (token, expert) slot of every "
            "gathered token, other ranks' slots computed on expert 0 and zeroed",
            slots=("routed_experts",),
            env_gate="DSV4OPT_GROUPED_MOE",
            risk="new MoE kernels; bf16 rounding of the activation rows, routing unchanged",
            changes_selection=False,
            needs_graph=True,
            module="dsv4opt.optimizations.grouped_moe",
            target_kernels="slot_gemv",
            parts=("moe",),
        ),
        Optimization(
            name="torch-compile",
            target_category="glue",
            replaces="the eager glue between the kernels: each block compiled by torch.compile (Inductor, default "
            "mode) with the kernels, GEMMs and other optimisations' slots as opaque ops in its graph",
            slots=("regions",),
            env_gate="DSV4OPT_TORCH_COMPILE",
            risk="compiled glue rounds differently (fp32 reassociation; bf16 intermediates kept in fp32); "
            "five graphs to compile before the first step",
            changes_selection=False,
            needs_graph=True,
            module="dsv4opt.optimizations.torch_compile",
            fuses_all_glue=True,
            # no parts: it compiles every block but replaces only their glue, which the glue rule bounds
        ),
        # Replaces the indexer_logits slot's call with its own scores: with both on, bf16-gemm's
        # indexer kernel is not called (its pre-mix still is).
        Optimization(
            name="indexer-topk",
            target_category="topk_sort",
            replaces="the indexer's scores over the page table's width, then their top-k (on the Hopper path the "
            "stand-ins for DeepGEMM's fp8_paged_mqa_logits and SGLang's topk_transform): scores of each request's "
            "own entries and their top-k, in one launch (two at small batch)",
            slots=("indexer_topk",),
            env_gate="DSV4OPT_INDEXER_TOPK",
            risk="new kernel picks the top-k: fp32 summation order can swap entries tied within rounding",
            changes_selection=True,
            needs_graph=True,
            module="dsv4opt.optimizations.indexer_topk",
            parts=("indexer",),
            needs_measurement=True,  # the indexer part also holds its query GEMM and quantisation
        ),
    )
}


def register(opt: Optimization) -> Optimization:
    """Add an optimisation (a package following the contract above); its name must be new."""
    if opt.name in OPTIMIZATIONS:
        raise DsvOptError(f"an optimisation named {opt.name!r} is already registered")
    OPTIMIZATIONS[opt.name] = opt
    return opt


def unregister(name: str) -> None:
    OPTIMIZATIONS.pop(name, None)


def get(name: str) -> Optimization:
    try:
        return OPTIMIZATIONS[name]
    except KeyError:
        raise unknown_name("optimisation", name, OPTIMIZATIONS) from None


def implementations(names: Iterable[str]) -> dict[str, Callable]:
    """Slot implementations the named optimisations provide, applied in registry order (later wins)."""
    wanted = {get(n).name for n in names}
    impls: dict[str, Callable] = {}
    for name, opt in OPTIMIZATIONS.items():
        if name in wanted:
            provided = opt.implementations()
            assert set(provided) <= set(opt.slots), f"{name} provides {set(provided)}, declared {opt.slots}"
            impls.update(provided)
    return impls


def env_enabled(environ: dict[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    return [o.name for o in OPTIMIZATIONS.values() if environ.get(o.env_gate, "") == "1"]
