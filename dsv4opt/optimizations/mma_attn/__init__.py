"""mma-attn: tensor-core split-K sparse-MLA decode attention for the `attention` slot.

The kernel module loads lazily (PEP 562): Triton picks interpreter or compiler when a kernel is
defined, and the CPU check must get to choose first.
"""

from dsv4opt.optimizations.mma_attn.check import check

__all__ = ["IMPLEMENTATIONS", "check", "mma_attention"]


def __getattr__(name: str):
    if name == "mma_attention":
        from dsv4opt.optimizations.mma_attn.kernel import mma_attention

        return mma_attention
    if name == "IMPLEMENTATIONS":
        from dsv4opt.optimizations.mma_attn.kernel import mma_attention

        return {"attention": mma_attention}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
