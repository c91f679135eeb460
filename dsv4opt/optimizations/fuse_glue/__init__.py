"""fuse-glue: the glue regions of the decode step, each fused into one Triton launch.

The kernel module loads lazily (PEP 562): Triton picks interpreter or compiler when a kernel is
defined, and a CPU check must get to run under the interpreter when it is asked for.
"""

from dsv4opt.optimizations.fuse_glue.check import check

__all__ = ["IMPLEMENTATIONS", "REPLACES", "check"]


def __getattr__(name: str):
    if name == "IMPLEMENTATIONS":
        from dsv4opt.optimizations.fuse_glue.kernel import IMPLEMENTATIONS

        return IMPLEMENTATIONS
    if name == "REPLACES":
        from dsv4opt.optimizations.fuse_glue.naive import REPLACES

        return REPLACES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
