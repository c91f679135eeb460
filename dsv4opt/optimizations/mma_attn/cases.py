"""The correctness table of the attention slot: named shapes and slot patterns, and their inputs.

Shared by the correctness gate (check.py), the tests and the GPU script so all three run the
same function on the same awkward inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PATTERNS = ("all", "half_unused", "one_empty", "short")


@dataclass(frozen=True)
class AttnCase:
    """One row of the table. `rope_dim` > 0 with split_kv stores rope apart from nope (FP8 layout)."""

    batch: int
    topk: int
    pattern: str  # one of PATTERNS
    heads: int = 64
    dim: int = 512
    rope_dim: int = 64
    split_kv: bool = False

    @property
    def name(self) -> str:
        layout = "-splitkv" if self.split_kv else ""
        return f"B{self.batch}-K{self.topk}-{self.pattern}-H{self.heads}-D{self.dim}{layout}"


def gpu_cases() -> list[AttnCase]:
    """The full table at the model's sizes (64 heads of 512): every B x K x pattern."""
    cases = [AttnCase(b, k, p) for b in (1, 3, 32, 64) for k in (1, 100, 512, 640) for p in PATTERNS]
    cases += [AttnCase(b, 640, p, split_kv=True) for b in (3, 64) for p in ("all", "short")]
    return cases


def interpreter_cases() -> list[AttnCase]:
    """Small enough for Triton's interpreter on a CPU: fewer heads and a narrow latent, plus one
    case at the real width D = 512 with small B and K."""
    small = dict(heads=8, dim=64, rope_dim=16)
    cases = [AttnCase(b, k, p, **small) for b, k in ((1, 1), (3, 37), (3, 100)) for p in PATTERNS]
    cases += [AttnCase(3, 100, "short", split_kv=True, **small)]
    cases += [AttnCase(2, 40, "half_unused", heads=16, dim=512, rope_dim=64)]
    return cases


@dataclass(frozen=True)
class AttnInputs:
    q: torch.Tensor  # [B, H, D]
    kv: torch.Tensor  # [N, D]
    indices: torch.Tensor  # [B, K] int32
    lengths: torch.Tensor  # [B] int32
    sink: torch.Tensor  # [H] fp32
    scale: float

    def args(self) -> tuple:
        return (self.q, self.kv, self.indices, self.lengths, self.sink, self.scale)


def make_inputs(case: AttnCase, device: torch.device | str, dtype: torch.dtype, seed: int = 0) -> AttnInputs:
    """Random inputs for one case; indices are distinct rows of a pool of max(4096, 4K) rows."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    B, K, H, D = case.batch, case.topk, case.heads, case.dim
    pool = max(4096, 4 * K)
    q = torch.randn(B, H, D, generator=gen)
    kv = torch.randn(pool, D, generator=gen)
    sink = torch.randn(H, generator=gen)
    indices = torch.stack([torch.randperm(pool, generator=gen)[:K] for _ in range(B)]).to(torch.int32)
    lengths = torch.full((B,), K, dtype=torch.int32)
    if case.pattern == "half_unused":
        indices[torch.rand(B, K, generator=gen) < 0.5] = -1
    elif case.pattern == "one_empty":
        indices[0] = -1
        lengths[-1] = 0 if B > 1 else lengths[-1]
    elif case.pattern == "short":
        lengths = torch.randint(0, K, (B,), generator=gen, dtype=torch.int32) if K > 1 else torch.zeros(B, dtype=torch.int32)
    elif case.pattern != "all":
        raise ValueError(f"unknown pattern {case.pattern!r}")
    return AttnInputs(
        q=q.to(device, dtype),
        kv=kv.to(device, dtype),
        indices=indices.to(device),
        lengths=lengths.to(device),
        sink=sink.to(device),
        scale=D**-0.5,
    )
