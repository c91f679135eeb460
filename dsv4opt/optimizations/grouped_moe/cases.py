"""The correctness table of the routed-experts slot: named shapes and routing patterns, and their inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4opt.workload.weights import Mxfp4Experts

PATTERNS = ("mixed", "all_other_ranks", "one_hot_expert", "no_other_ranks", "all_on_one")


@dataclass(frozen=True)
class MoeCase:
    """M gathered tokens, top-k slots each, R local experts of width I on a hidden size d."""

    tokens: int
    pattern: str
    hidden: int = 4096
    width: int = 2048
    experts: int = 32
    topk: int = 6
    scale_shift: int = 0  # scales times 2^shift: past 2 (shift >= 8 here) the kernels' two-multiply path

    @property
    def name(self) -> str:
        big = f"-x2^{self.scale_shift}" if self.scale_shift else ""
        return f"M{self.tokens}-{self.pattern}-d{self.hidden}-I{self.width}-R{self.experts}-k{self.topk}{big}"


TP4 = dict(width=512, experts=256)  # 256 experts sharded over 4 ranks along I


def gpu_cases() -> list[MoeCase]:
    """The model's shapes on one of 8 ranks: dp-ep (32 whole experts, 8C gathered tokens) at C = 1, 4,
    32, and tp4 (256 experts of width 512, the rank's own C tokens) at C = 1, 13, 64; the scale path
    past 2; plus the small table (hidden and width not powers of two, more experts than slots)."""
    cases = [MoeCase(8, "mixed"), MoeCase(32, "one_hot_expert"), MoeCase(256, "mixed"), MoeCase(8, "all_other_ranks"),
             MoeCase(24, "no_other_ranks"), MoeCase(1, "no_other_ranks", **TP4), MoeCase(13, "no_other_ranks", **TP4),
             MoeCase(64, "no_other_ranks", **TP4), MoeCase(64, "all_on_one", **TP4),
             MoeCase(16, "no_other_ranks", scale_shift=9, **TP4),
             MoeCase(2, "no_other_ranks", scale_shift=9, **TP4)]  # scales past 2 where the table's row is direct
    cases += interpreter_cases()
    return cases


def interpreter_cases() -> list[MoeCase]:
    """Small enough for Triton's interpreter: every pattern, odd token counts, widths of whole
    MXFP4 groups that are not powers of two."""
    small = dict(hidden=64, width=96, experts=5, topk=3)
    cases = [MoeCase(m, p, **small) for m in (1, 13) for p in PATTERNS]
    cases += [MoeCase(21, "mixed", hidden=160, width=32, experts=3, topk=2), MoeCase(3, "mixed", hidden=64, width=64, experts=40, topk=6),
              MoeCase(5, "all_on_one", **small), MoeCase(4, "no_other_ranks", scale_shift=9, **small)]
    return cases


@dataclass(frozen=True)
class MoeInputs:
    x: torch.Tensor  # [M, d]
    local_ids: torch.Tensor  # [M, k] int32, -1: another rank's expert
    gates: torch.Tensor  # [M, k] fp32
    w13: Mxfp4Experts
    w2: Mxfp4Experts
    limit: float = 10.0
    scale: float = 1.5

    def args(self) -> tuple:
        return (self.x, self.local_ids, self.gates, self.w13, self.w2, self.limit, self.scale)


def make_inputs(case: MoeCase, device, dtype: torch.dtype, seed: int = 0) -> MoeInputs:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    M, k, R = case.tokens, case.topk, case.experts
    w13 = Mxfp4Experts(R, 2 * case.width, case.hidden, gen, "cpu")
    w2 = Mxfp4Experts(R, case.hidden, case.width, gen, "cpu")
    ids = torch.randint(0, R, (M, k), generator=gen, dtype=torch.int32)
    if case.pattern == "mixed":  # as on one of 8 EP ranks: about 7 in 8 slots on other ranks
        ids[torch.rand(M, k, generator=gen) < 0.875] = -1
    elif case.pattern == "all_other_ranks":
        ids[:] = -1
    elif case.pattern == "one_hot_expert":  # every token's first slot on expert 0: a tile run longer than one tile
        ids[:, 0] = 0
        ids[:, 1:][torch.rand(M, k - 1, generator=gen) < 0.5] = -1
    elif case.pattern == "all_on_one":  # every slot of every token on the last expert: one long run
        ids[:] = R - 1
    elif case.pattern != "no_other_ranks":
        raise ValueError(f"unknown pattern {case.pattern!r}")
    if case.scale_shift:
        w13.scales *= 2.0**case.scale_shift  # gate/up saturate at the SwiGLU's clamp: the output stays finite
    gates = torch.rand(M, k, generator=gen)
    gates = gates / gates.sum(-1, keepdim=True)
    x = torch.randn(M, case.hidden, generator=gen)
    for w in (w13, w2):
        w.packed, w.scales = w.packed.to(device), w.scales.to(device)
    return MoeInputs(x.to(device, dtype), ids.to(device), gates.to(device), w13, w2)
