"""What every Triton kernel in dsv4opt shares: constants, and where Triton may run.

Triton picks interpreter or compiler when a kernel is defined (at import), from TRITON_INTERPRET.
On a CPU, Triton runs only under its interpreter; there a bf16 `tl.dot` multiplies raw bit patterns
(triton-lang/triton#11584), so kernels are written generic over dtype and tested in float16/32.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, replace

import torch

from dsv4opt.errors import DsvOptError
from dsv4opt.formats import FP8_MAX, LN2, LOG2E  # noqa: F401  (re-exported for the kernels)


def interpreted() -> bool:
    """Triton kernels run in the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def runs_triton(t: torch.Tensor) -> bool:
    """A Triton kernel can take `t`: it lives on a CUDA GPU, or the interpreter is on and no bf16
    tensor-core product would be emulated wrongly (callers with `tl.dot` on bf16 check that), or a
    compile-only check is compiling the launches (`compile_only_target`)."""
    return t.is_cuda or interpreted() or compile_only()


def on_gpu(t: torch.Tensor) -> bool:
    """`t` is on a CUDA GPU, or stands for one in a compile-only check: the GPU paths are taken."""
    return t.is_cuda or compile_only()


@dataclass(frozen=True)
class DeviceLimits:
    """What one GPU allows a kernel: the figures its launch and residency depend on."""

    name: str
    capability: tuple[int, int]
    sms: int
    shared_per_block: int  # bytes a block may ask for (the opt-in maximum Triton's launcher checks)
    shared_per_sm: int
    regs_per_sm: int
    threads_per_sm: int


# Hopper's shared memory a block (sm_90: 227 KB). Kernels tiled for it check the device against this.
HOPPER_SHARED_PER_BLOCK = 232448
# Caps the shared memory a block may use below what the device has, so that a Hopper card runs the
# kernels a GPU with less (sm_120, sm_89: 99 KB) would get: the tile tables read the cap, not the card.
SHARED_LIMIT_ENV = "DSV4OPT_SHARED_MEMORY_LIMIT"
_STAND_IN: list[DeviceLimits] = []  # a compile-only check's target, in place of the device (compile_only)


def device_limits(device: torch.device) -> DeviceLimits:
    """The limits of a CUDA device (the current one when `device` names no index), read from the
    device, with the shared memory a block capped by DSV4OPT_SHARED_MEMORY_LIMIT where it is set."""
    if _STAND_IN:
        return _STAND_IN[-1]
    limits = _read_limits(device.index if device.index is not None else torch.cuda.current_device())
    cap = os.environ.get(SHARED_LIMIT_ENV)
    if cap:
        try:
            limits = replace(limits, shared_per_block=min(limits.shared_per_block, int(cap)))
        except ValueError:
            raise DsvOptError(f"{SHARED_LIMIT_ENV}={cap!r} is not a number of bytes") from None
    return limits


@functools.lru_cache(maxsize=None)
def _read_limits(index: int) -> DeviceLimits:
    p = torch.cuda.get_device_properties(index)
    return DeviceLimits(
        name=p.name, capability=(p.major, p.minor), sms=p.multi_processor_count,
        shared_per_block=p.shared_memory_per_block_optin, shared_per_sm=p.shared_memory_per_multiprocessor,
        regs_per_sm=p.regs_per_multiprocessor, threads_per_sm=p.max_threads_per_multi_processor,
    )


@contextlib.contextmanager
def compile_only_target(limits: DeviceLimits):
    """Within: every device query above answers with `limits`, and `runs_triton` is true, so a
    compile-only check (tests/compile/) steps the workload with the launches a GPU of those limits gets."""
    _STAND_IN.append(limits)
    try:
        yield
    finally:
        _STAND_IN.pop()


def compile_only() -> bool:
    """A compile-only check is stepping the workload (compile_only_target): launches compile, never run."""
    return bool(_STAND_IN)


def sm_count(device: torch.device) -> int:
    """The streaming multiprocessors of a CUDA device (the current one when `device` names no index)."""
    return device_limits(device).sms


def dot_dtype_ok(dtype: torch.dtype) -> bool:
    """`tl.dot` gives the right answer for `dtype` here (the interpreter mishandles bf16)."""
    return not (interpreted() and dtype == torch.bfloat16)


import triton  # noqa: E402
import triton.language as tl  # noqa: E402

try:
    # The interpreter imports Gluon lazily while it runs a kernel, when triton.language is patched
    # and the import fails (seen on Triton 3.9 after other kernels ran): import it up front.
    import triton.experimental.gluon  # noqa: E402, F401
except ImportError:
    pass


@triton.jit
def round_to_e4m3(x, EMULATE: tl.constexpr):
    """x (fp32) rounded to the nearest e4m3 value (ties to even), still fp32.

    The interpreter's fp32 -> fp8 conversion drops the carry when rounding reaches the next power
    of two (124.3 -> 64); kernels round here first under the interpreter so the conversion that
    follows is exact. On a GPU (EMULATE false) the hardware conversion rounds and this returns x.
    """
    if EMULATE:
        a = tl.abs(x)
        e = tl.maximum(tl.floor(tl.log2(tl.maximum(a, 1e-30))), -6.0)  # e4m3: normals from 2^-6
        step = tl.exp2(e - 3.0)  # 3 mantissa bits
        y = a / step
        r = tl.floor(y + 0.5)
        r = tl.where((r - y == 0.5) & (r - 2.0 * tl.floor(r * 0.5) == 1.0), r - 1.0, r)
        x = tl.where(x < 0, -r * step, r * step)
    return x


_FP8_MAX = tl.constexpr(FP8_MAX)


@triton.jit
def quantize_e4m3(x, eps, EMULATE: tl.constexpr, POW2: tl.constexpr = False):
    """x (fp32, one row or group) under one scale max(amax, eps) / FP8_MAX, rounded up to a power of
    two with POW2 (UE8M0 scales): (x / scale rounded to e4m3 and still fp32, the fp32 scale). The
    plain-torch forms are quant.quantize_groups_fp8 and (POW2) production.act_quant.quantize_groups_ue8m0."""
    s = tl.maximum(tl.max(tl.abs(x), axis=0), eps) / _FP8_MAX
    if POW2:
        s = tl.exp2(tl.ceil(tl.log2(s)))
    return round_to_e4m3(tl.clamp(x / s, -_FP8_MAX, _FP8_MAX), EMULATE), s


@triton.jit
def round_to_bf16(x, EMULATE: tl.constexpr):
    """x (fp32) rounded to the nearest bf16 value (ties to even), still fp32. The interpreter's
    fp32 -> bf16 conversion truncates; on a GPU (EMULATE false) the conversion rounds."""
    if EMULATE:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x


@triton.jit
def approx_reciprocal(x, EMULATE: tl.constexpr):
    """1 / x to within an ulp or two (PTX rcp.approx.ftz: one MUFU instruction), for dependent
    chains where the range checks of a full-range division set the latency. Under the interpreter
    (EMULATE true), which cannot run PTX, a plain division."""
    if EMULATE:
        y = 1.0 / x
    else:
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                      pack=1)
    return y
