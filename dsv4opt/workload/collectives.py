"""The collectives one rank runs: the all-reduces of tensor parallelism, and how a DP-attention + EP
rank's MoE reaches the other ranks' tokens.

Tensor parallelism (dsv4opt/workload/layout.py) all-reduces `wo_b`'s output and the MoE's, each
[C, hidden] in the model dtype (deepseek_v4.py:439-448 `reduce_results`; deepseek_v2.py:948-953,
1064-1069 `tensor_model_parallel_all_reduce`).

With data-parallel attention and no all-to-all backend (`moe_a2a_backend` none, which nothing on
sm_120 changes), SGLang's DeepSeek-V4 decoder layer (deepseek_v4.py:1495-1565 at
sgl-project/sglang@37ef295c7) runs no all-to-all:

- dispatch: `dp_gather_partial` all-gathers every DP rank's hidden states into each rank's MoE
  (`all_gather_into_tensor`: decode pads every rank to the same token count, DpPaddingMode.MAX_LEN);
  each rank maps experts on other ranks to -1 (token_dispatcher/standard.py:169-212);
- combine: one reduce-scatter (`reduce_scatterv`, since `should_use_dp_reduce_scatterv()` holds
  when the EP size equals the DP size; it replaces the MoE's post-experts all-reduce): each rank
  receives, for its own rows, the sum of every rank's partial output (its experts' slots and its
  shard of the tensor-parallel shared expert);
- the token ids that hash routing reads are all-gathered once per step, before the layers
  (deepseek_v4.py:1697-1704).
"""

from __future__ import annotations

import torch


class ModelledRanks:
    """One process playing rank 0 of `ranks`: the other ranks' tokens are copies of its own and the
    combine keeps its own rows of its partial sums, so nothing is communicated."""

    real = False  # the other ranks are not processes
    rank = 0

    def __init__(self, ranks: int):
        self.ranks = ranks

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x: [C, ...] -> [ranks * C, ...], rank-major."""
        return x.repeat(self.ranks, *([1] * (x.dim() - 1)))

    def reduce_scatter(self, y: torch.Tensor) -> torch.Tensor:
        """y: [ranks * C, ...] -> [C, ...]: this rank's rows."""
        return y[: y.shape[0] // self.ranks]

    def all_reduce(self, y: torch.Tensor) -> torch.Tensor:
        """The sum over ranks would add the other ranks' partial outputs: left out, y as it is."""
        return y

    def barrier(self) -> None:
        pass


class ProcessGroupRanks:
    """This process is one rank of the default torch.distributed group (gloo on a CPU, NCCL on GPUs)."""

    real = True

    def __init__(self):
        import torch.distributed as dist

        self._dist = dist
        self.rank, self.ranks = dist.get_rank(), dist.get_world_size()
        # torch 2.13 renamed the tensor collectives; older builds (a GPU image's) have only the old names.
        self._gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x: [C, ...] -> [ranks * C, ...], rank-major (every rank's rows, this rank's among them)."""
        out = torch.empty((self.ranks * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        self._gather(out, x.contiguous())
        return out

    def reduce_scatter(self, y: torch.Tensor) -> torch.Tensor:
        """y: [ranks * C, ...] -> [C, ...]: the sum over ranks of this rank's rows."""
        out = torch.empty((y.shape[0] // self.ranks, *y.shape[1:]), dtype=y.dtype, device=y.device)
        self._scatter(out, y.contiguous())
        return out

    def all_reduce(self, y: torch.Tensor) -> torch.Tensor:
        """y: [C, ...] -> the sum over ranks, in place."""
        self._dist.all_reduce(y)
        return y

    def barrier(self) -> None:
        self._dist.barrier()
