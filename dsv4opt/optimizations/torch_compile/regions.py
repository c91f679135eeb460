"""The `regions` slot for torch-compile: each block of the step compiled by torch.compile.

A block (one layer's attention or FFN block) is the compile region: the kernels, GEMMs and
optimisation slots in it are opaque ops (ops.py), so Dynamo traces the whole block as one graph and
Inductor fuses the eager glue between the kernels. Blocks of layers with the same kind and shapes
share one compiled graph (Dynamo guards on the layer's kind and tensor shapes, not on which layer
it is), so 43 layers compile five graphs: window, CSA and HCA attention blocks, hash-routed and
routed FFN blocks. A whole step in one region would unroll 43 layers into one graph (minutes more
to compile, nothing more to fuse: blocks meet at custom kernels); a region per model part would
leave parts' glue unfused across part boundaries and multiply the graphs by ten.

Compilation happens on a block's first call (the warm-up, before any CUDA-graph capture); the
capture then records the compiled kernels and the graph replays them.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable

import torch

# Gates and tests build workloads of other shapes in one process, and each adds graphs. Past the
# limit Dynamo would run a block uncompiled without a word, which a gate must never mistake for
# compiled code: the limit is raised and reaching it is an error.
RECOMPILE_LIMIT = 64


def _not_the_ranges_warning(record: logging.LogRecord) -> bool:
    """Dynamo warns that it ignores the model parts' record_function ranges; Inductor would drop
    them anyway (they block fusion), docs/optimizations/torch_compile.md says so once for all runs."""
    return "Profiler record function" not in record.getMessage()


class CompiledRegions:
    """The `regions` slot implementation: blocks compiled by `backend` (Inductor, default mode).

    One torch.compile wrapper per block function, shared by every workload that uses this object:
    Dynamo's cache is per function and backend, so workloads of equal shapes reuse the graphs.
    """

    def __init__(self, backend: str | Callable = "inductor"):
        self.backend = backend
        self._compiled: dict[Callable, Callable] = {}

    def __call__(self, block, impls):
        from dsv4opt.optimizations.torch_compile import ops

        fn, owner = getattr(block, "__func__", block), getattr(block, "__self__", None)
        run = self._compiled.get(fn)
        if run is None:
            ops.install_kernels()
            logging.getLogger("torch._dynamo.variables.ctx_manager").addFilter(_not_the_ranges_warning)
            import torch._dynamo

            config = torch._dynamo.config
            config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
            config.fail_on_recompile_limit_hit = True
            # dynamic=False: each layer kind gets its own static graph rather than one symbolic one
            run = self._compiled[fn] = torch.compile(fn, backend=self.backend, dynamic=False)
        ops.install_slots(impls)
        return run if owner is None else functools.partial(run, owner)
