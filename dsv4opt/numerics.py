"""How far an output is from its reference: one report used by tests and correctness gates alike."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import is_fake


@dataclass(frozen=True)
class ErrorReport:
    rel: float  # ||out - ref|| / ||ref|| over finite reference elements
    max_abs: float
    worst_index: tuple[int, ...]
    nonfinite: int  # elements of out that are NaN/inf where ref is finite

    def ok(self, rel_tol: float) -> bool:
        return self.nonfinite == 0 and self.rel <= rel_tol

    def __str__(self) -> str:
        return (
            f"rel {self.rel:.3e}, max abs {self.max_abs:.3e} at {list(self.worst_index)}, "
            f"non-finite {self.nonfinite}"
        )


def error_report(out: torch.Tensor, ref: torch.Tensor) -> ErrorReport:
    """Compare in float64 on the CPU; a NaN in `out` counts as non-finite, never as small."""
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: {tuple(out.shape)} vs {tuple(ref.shape)}")
    out = out.detach().to("cpu", torch.float64)
    ref = ref.detach().to("cpu", torch.float64)
    finite_ref = torch.isfinite(ref)
    nonfinite = int((~torch.isfinite(out) & finite_ref).sum())
    diff = torch.where(finite_ref, out - ref, torch.zeros_like(ref))
    diff = torch.nan_to_num(diff, nan=float("inf"))
    denom = torch.linalg.vector_norm(torch.where(finite_ref, ref, torch.zeros_like(ref)))
    num = torch.linalg.vector_norm(diff)
    rel = float(num / denom) if float(denom) > 0 else float(num)
    absdiff = diff.abs()
    if absdiff.numel() == 0:
        return ErrorReport(0.0, 0.0, (), 0)
    flat = int(absdiff.reshape(-1).argmax())
    worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), absdiff.shape))
    return ErrorReport(rel, float(absdiff.reshape(-1)[flat]), worst, nonfinite)


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill a new floating tensor with NaN, so an element a kernel forgets to write fails a comparison."""
    if t.is_floating_point() and t.numel() and t.dtype.itemsize >= 2:
        t.fill_(float("nan"))
    return t


INT_POISON = 0x5A  # every byte of a poisoned integer or bool tensor: no valid bool, no small index


def poison_any(t: torch.Tensor) -> torch.Tensor:
    """NaN for floating tensors, bytes of INT_POISON for integer and bool ones (a bool output read
    back as uint8 then shows an unwritten element as neither 0 nor 1)."""
    if t.is_floating_point():
        return poison(t)
    if t.numel() and t.is_contiguous() and not t.is_complex():
        t.view(torch.uint8).fill_(INT_POISON)
    return t


@contextlib.contextmanager
def nan_poisoned_allocations(ints: bool = False):
    """torch.empty / empty_like return NaN-filled floating tensors while inside (gates and tests);
    with `ints`, integer and bool tensors too (poison_any)."""
    chosen = poison_any if ints else poison

    def fill(t: torch.Tensor) -> torch.Tensor:
        # A tensor being traced (a compiler's fake tensor) holds no data to poison, and a fill there
        # would be written into the graph: Inductor's decompositions call torch.empty while tracing.
        return t if is_fake(t) else chosen(t)

    empty, empty_like = torch.empty, torch.empty_like
    torch.empty = lambda *a, **k: fill(empty(*a, **k))
    torch.empty_like = lambda *a, **k: fill(empty_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like
