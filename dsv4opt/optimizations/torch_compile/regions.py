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

The model's parts survive: Dynamo drops their record_function ranges (and Inductor would fuse across
them), so before the graph goes to the backend each opaque op's call is given the part its line of
model.py sits in (`part=`, ops.py), and runs inside a range of that name. The workload's kernels,
GEMMs and slots keep their parts; the glue Inductor fuses, often across two parts, has none of its own.
"""

from __future__ import annotations

import ast
import functools
import inspect
import logging
import re
from typing import Callable

import torch

# Gates and tests build workloads of other shapes in one process, and each adds graphs. Past the
# limit Dynamo would run a block uncompiled without a word, which a gate must never mistake for
# compiled code: the limit is raised and reaching it is an error.
RECOMPILE_LIMIT = 64
_LIB = "dsv4opt"  # ops.py's library: its ops' names in a graph start "dsv4opt."


def _not_the_ranges_warning(record: logging.LogRecord) -> bool:
    """Dynamo warns that it ignores the model parts' record_function ranges; Inductor would drop
    them anyway (they block fusion), docs/optimizations/torch_compile.md says so once for all runs."""
    return "Profiler record function" not in record.getMessage()


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@functools.cache
def _part_lines() -> tuple[str, tuple[tuple[int, int, str], ...]]:
    """model.py's path and its `with record_function("name"):` blocks as (first line, last line, name)."""
    from dsv4opt.workload import model

    path = inspect.getsourcefile(model)
    tree = ast.parse(inspect.getsource(model))
    blocks = []
    for node in ast.walk(tree):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "record_function" and call.args
                        and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
                    blocks.append((node.lineno, node.end_lineno, call.args[0].value))
    return path, tuple(blocks)


def part_of(stack_trace: str | None) -> str:
    """The model part a traced call ran in: the innermost record_function block of model.py around
    the innermost model.py line of its stack, "" when none is."""
    path, blocks = _part_lines()
    for file, line in reversed(_FRAME.findall(stack_trace or "")):
        if file != path:
            continue
        around = [(end - start, name) for start, end, name in blocks if start <= int(line) <= end]
        if around:
            return min(around)[1]
    return ""


def tag_parts(gm: torch.fx.GraphModule) -> int:
    """Give each call of a dsv4opt op in Dynamo's graph the part it runs in (its `part` keyword);
    returns how many calls got one."""
    tagged = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and str(node.target).startswith(f"{_LIB}.") and "part" not in node.kwargs:
            part = part_of(node.meta.get("stack_trace"))
            if part:
                node.kwargs = {**node.kwargs, "part": part}
                tagged += 1
    if tagged:
        gm.recompile()
    return tagged


def with_parts(backend: str | Callable) -> Callable:
    """`backend` (a name or a compiler) with tag_parts run on each graph first."""
    if backend == "inductor":
        from torch._inductor.compile_fx import compile_fx as compiler
    elif isinstance(backend, str):
        from torch._dynamo.backends.registry import lookup_backend

        compiler = lookup_backend(backend)
    else:
        compiler = backend

    def compile_with_parts(gm, example_inputs):
        tag_parts(gm)
        return compiler(gm, example_inputs)

    return compile_with_parts


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
            run = self._compiled[fn] = torch.compile(fn, backend=with_parts(self.backend), dynamic=False)
        ops.install_slots(impls)
        return run if owner is None else functools.partial(run, owner)
