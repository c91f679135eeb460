"""torch-compile: each block of the step compiled by torch.compile, the kernels opaque ops in its graph.

The `regions` slot's implementation; ops.py makes the workload's kernels and other optimisations'
slots opaque to Dynamo, regions.py compiles the blocks, check.py is the gate.
"""

from dsv4opt.optimizations.torch_compile.check import check
from dsv4opt.optimizations.torch_compile.regions import CompiledRegions

IMPLEMENTATIONS = {"regions": CompiledRegions()}

__all__ = ["IMPLEMENTATIONS", "CompiledRegions", "check"]
