"""What each rank runs in the multi-rank workload tests: module-level, so the ranks import it by name."""

from __future__ import annotations

import torch

from dsv4opt.numerics import nan_poisoned_allocations
from dsv4opt.workload.collectives import ProcessGroupRanks
from dsv4opt.workload.config import ModelConfig


class CopiesForOtherRanks(ProcessGroupRanks):
    """A broken dispatch: every rank's MoE sees copies of its own tokens instead of the other ranks'."""

    def all_gather(self, x):
        return x.repeat(self.ranks, *([1] * (x.dim() - 1)))


class NoCombine(ProcessGroupRanks):
    """A broken combine: each rank keeps its own partial sums (its experts' slots, its shared shard)."""

    def reduce_scatter(self, y):
        C = y.shape[0] // self.ranks
        return y[self.rank * C : (self.rank + 1) * C].clone()


class NoAllReduce(ProcessGroupRanks):
    """A broken tensor-parallel rank: it keeps its own partial sums of wo_b's and the MoE's outputs."""

    def all_reduce(self, y):
        return y


COMMS = {"real": ProcessGroupRanks, "copies": CopiesForOtherRanks, "no-combine": NoCombine,
         "no-all-reduce": NoAllReduce}


def step_logits(ctx, config: str, concurrency: int, context: int, tokens: list[torch.Tensor], seed: int,
                comm: str = "real", layout: str = "dp-ep") -> list[torch.Tensor]:
    """This rank's logits for each step of `tokens` (dp-ep: every rank's tokens per step, rank-major;
    tensor parallel: every rank runs them all)."""
    from dsv4opt.workload.model import DecodeWorkload

    ctx.join()
    torch.set_num_threads(1)
    with nan_poisoned_allocations():  # as in the test process: an unwritten element stays NaN
        wl = DecodeWorkload(ModelConfig.from_name(config), concurrency=concurrency, context=context,
                            dtype=torch.float32, seed=seed, comm=COMMS[comm](), layout=layout)
        if layout != "dp-ep":
            return [wl.step(t) for t in tokens]
        mine = slice(ctx.rank * concurrency, (ctx.rank + 1) * concurrency)
        return [wl.step(t[mine]) for t in tokens]
