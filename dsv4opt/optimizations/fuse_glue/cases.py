"""Inputs for each glue region: the gate's table of awkward shapes and the dsv4-flash shapes it runs at.

Every case builds the slot's positional arguments the way the model produces them: routing tables
with -1 for experts held elsewhere (most gathered rows belong to other ranks), activations beyond
SGLang's clamp, slots of other ranks holding garbage the combine must never let through.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4opt.workload.config import ModelConfig
from dsv4opt.workload.weights import Mxfp4Experts

SLOTS = ("hc_split_sum", "moe_local", "routed_experts")  # the model's slots fuse-glue fills
# The regions checked one by one: the slots, and the per-slot path's three glue pieces inside routed_experts.
REGIONS = ("hc_split_sum", "moe_local", "moe_slots", "moe_act", "moe_combine", "routed_experts")
FLASH = ModelConfig.from_name("dsv4-flash")
GARBAGE = 1.0e3  # what the other ranks' slots hold: finite (the eager path multiplies it by zero), never small


@dataclass(frozen=True)
class GlueCase:
    """One region call. rows: tokens (hc_split_sum) or gathered rows M (MoE); width: hidden d, or I for
    moe_act; expert_width: I of routed_experts; k experts per row; experts E over `ranks` ranks with
    `resident` sets each; `mine`: the
    fraction of rows that are this rank's own (the rest route to -1); `every_expert`: this rank's rows
    route every expert to set e mod resident, as the model run by one process does (else only
    `resident` random experts are held here)."""

    region: str
    name: str
    rows: int
    width: int
    hc: int = 4
    expert_width: int = 32
    k: int = 6
    experts: int = 16
    ranks: int = 4
    resident: int = 4
    mine: float = 0.25
    every_expert: bool = False

    @property
    def id(self) -> str:
        return f"{self.region}:{self.name}"


def interpreter_cases() -> list[GlueCase]:
    """Small and awkward: one row, widths off the block size, several column blocks, every slot elsewhere."""
    return [
        GlueCase("hc_split_sum", "one-token", 1, 16),
        GlueCase("hc_split_sum", "odd-width", 3, 100),
        GlueCase("hc_split_sum", "several-blocks", 2, 2500),
        GlueCase("hc_split_sum", "two-copies", 5, 64, hc=2),
        GlueCase("hc_split_sum", "tokens-past-a-sinkhorn-block", 37, 24),
        GlueCase("moe_local", "one-slot", 1, 0, k=1, experts=4, ranks=1, resident=4, mine=1.0),
        GlueCase("moe_local", "slots-past-one-block", 50, 0, k=6, experts=16, ranks=4, resident=4),
        GlueCase("moe_local", "every-slot-elsewhere", 3, 0, k=3, experts=8, ranks=2, resident=2, mine=0.0),
        GlueCase("moe_slots", "one-slot", 1, 0, k=1, mine=1.0, every_expert=True),
        GlueCase("moe_slots", "slots-past-one-block", 50, 0, k=6),
        GlueCase("moe_act", "one-slot", 1, 8),
        GlueCase("moe_act", "odd-width", 7, 33),
        GlueCase("moe_act", "several-blocks", 3, 2500),
        GlueCase("moe_combine", "one-row-one-slot", 1, 16, k=1, mine=1.0, every_expert=True),
        GlueCase("moe_combine", "top3-odd-width", 5, 100, k=3, mine=0.4, every_expert=True),
        GlueCase("moe_combine", "top6-some-held-several-blocks", 4, 2500, k=6, mine=0.5),
        GlueCase("moe_combine", "every-slot-elsewhere", 3, 64, k=2, mine=0.0),
        GlueCase("routed_experts", "top3-half-here", 6, 64, expert_width=32, k=3, experts=8, resident=4, mine=0.5,
                 every_expert=True),
        GlueCase("routed_experts", "top2-odd-groups", 5, 160, expert_width=96, k=2, experts=6, resident=3, mine=0.6),
        GlueCase("routed_experts", "every-slot-elsewhere", 3, 64, expert_width=32, k=2, experts=4, resident=2, mine=0.0),
    ]


def flash_cases(concurrency: int) -> list[GlueCase]:
    """The regions at dsv4-flash's shapes for one rank of C requests (the MoE over all ranks' rows)."""
    cfg, C = FLASH, concurrency
    M = C * cfg.expert_parallel
    moe = dict(k=cfg.experts_per_token, experts=cfg.experts, ranks=cfg.expert_parallel,
               resident=cfg.experts_resident_default, mine=1.0 / cfg.expert_parallel, every_expert=True)
    return [
        GlueCase("hc_split_sum", f"dsv4-flash-c{C}", C, cfg.hidden, hc=cfg.hc),
        GlueCase("moe_local", f"dsv4-flash-c{C}", M, 0, **moe),
        GlueCase("moe_slots", f"dsv4-flash-c{C}", M, 0, **moe),
        GlueCase("moe_act", f"dsv4-flash-c{C}", M * cfg.experts_per_token, cfg.expert_width, **moe),
        GlueCase("moe_combine", f"dsv4-flash-c{C}", M, cfg.hidden, **moe),
    ]


def gpu_cases() -> list[GlueCase]:
    """The small table, dsv4-flash's shapes at C = 1 and 32, and the routed experts at the model's
    widths (the float64 reference dequantises every resident expert)."""
    cfg = FLASH
    routed = [GlueCase("routed_experts", f"dsv4-flash-c{c}", c * cfg.expert_parallel, cfg.hidden,
                       expert_width=cfg.expert_width, k=cfg.experts_per_token, experts=cfg.experts,
                       ranks=cfg.expert_parallel, resident=cfg.experts_resident_default,
                       mine=1.0 / cfg.expert_parallel, every_expert=True) for c in (1, 4)]
    return interpreter_cases() + flash_cases(1) + flash_cases(32) + routed


def make_args(case: GlueCase, device, dtype: torch.dtype, gen: torch.Generator) -> tuple:
    """The slot's positional arguments for `case` on `device`; activations in `dtype`."""
    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    if case.region == "hc_split_sum":
        T, hc, d = case.rows, case.hc, case.width
        flat = randn(T, hc * d)
        rsqrt = torch.rsqrt(flat.square().mean(-1) + 1e-6)
        mix = randn(T, 2 * hc + hc * hc, scale=3.0)
        scale = (torch.rand(3, generator=gen) + 0.5).to(device)
        return (mix, rsqrt, flat, scale, randn(2 * hc + hc * hc), hc, FLASH.hc_sinkhorn_iters, FLASH.hc_eps, dtype)
    ids, owner, row_rank = _routing(case, device, gen)
    if case.region == "moe_local":
        return (ids, owner, row_rank)
    local = owner[row_rank[:, None], ids]
    if case.region == "moe_slots":
        return (local,)
    if case.region == "moe_act":
        # Scaled so that a good share of gates and ups lie beyond the clamp.
        return (randn(case.rows, 2 * case.width, scale=8.0).to(dtype), FLASH.swiglu_limit)
    M, k, d = case.rows, case.k, case.width
    gates = torch.rand(M, k, generator=gen).to(device)
    gates = gates / gates.sum(-1, keepdim=True)
    if case.region == "routed_experts":
        R, I = case.resident, case.expert_width
        w13 = Mxfp4Experts(R, 2 * I, d, gen, "cpu")
        w2 = Mxfp4Experts(R, d, I, gen, "cpu")
        for w in (w13, w2):
            w.packed, w.scales = w.packed.to(device), w.scales.to(device)
        # Scaled so that the first GEMV's gates and ups reach beyond SGLang's clamp.
        return (randn(M, d, scale=4.0).to(dtype), local, gates, w13, w2, FLASH.swiglu_limit, FLASH.routed_scale)
    invalid = local.reshape(-1) < 0
    down = randn(M * k, d).to(dtype)
    down[invalid] = GARBAGE
    return (down, invalid, gates, FLASH.routed_scale)


def _routing(case: GlueCase, device, gen: torch.Generator):
    """ids [M, k] int32 (distinct experts per row), owner [ranks, E] int32, row_rank [M] int64: this
    rank's rows first (experts resident here map to their set, others to -1), then other ranks' rows."""
    M, k, E, R = case.rows, case.k, case.experts, case.resident
    ids = torch.rand(M, E, generator=gen).argsort(-1)[:, :k].to(torch.int32)
    owner = torch.full((case.ranks, E), -1, dtype=torch.int32)
    if case.every_expert:
        owner[0] = torch.arange(E, dtype=torch.int32) % R
    else:
        held = torch.randperm(E, generator=gen)[: min(R, E)]
        owner[0, held] = torch.arange(len(held), dtype=torch.int32)
    own_rows = round(case.mine * M)
    row_rank = torch.cat([torch.zeros(own_rows, dtype=torch.int64),
                          torch.randint(1, max(2, case.ranks), (M - own_rows,), generator=gen)]).clamp(max=case.ranks - 1)
    if case.mine == 0.0 and case.ranks > 1:
        row_rank.clamp_(min=1)
    return ids.to(device), owner.to(device), row_rank.to(device)
