"""Launch a cubin's kernel on torch's current stream through the CUDA driver (ctypes over libcuda).

What TileLang's runtime does for its kernels, without TileLang: `cuModuleLoadData` once per device
context, `cuFuncSetAttribute` for dynamic shared memory over 48 KB, then `cuLaunchKernelEx` on
torch's current stream (the capture stream inside a CUDA graph), with the programmatic stream
serialization attribute when the kernel waits on its predecessor (`griddepcontrol.wait`): PDL, as
SGLang's TileLang kernels are built on sm_90 (`is_arch_support_pdl`, kernels/jit/utils/arch.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from dsv4opt.errors import DsvOptError

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_STATIC_SMEM_LIMIT = 48 * 1024


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: a 4-byte id, padding to 8, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""

    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_driver: ctypes.CDLL | None = None


def driver() -> ctypes.CDLL:
    global _driver
    if _driver is None:
        try:
            _driver = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise DsvOptError(f"cannot load the CUDA driver (libcuda.so.1): {exc}") from None
    return _driver


def check(result: int, what: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        driver().cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: {name.value.decode() if name.value else result}")


def _primary_context_current(device: int) -> None:
    """Make the device's primary context (torch's) current on this thread, without a sync: a first
    load may happen while a CUDA graph is being captured."""
    cu = driver()
    ctx = ctypes.c_void_p()
    check(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    primary = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev), "cuDevicePrimaryCtxRetain")
    if ctx.value != primary.value:
        check(cu.cuCtxSetCurrent(primary), "cuCtxSetCurrent")


@dataclass
class CubinKernel:
    """One kernel of a cubin: its entry, its parameters' C types in order, its dynamic shared memory."""

    image: bytes
    entry: str
    param_types: tuple[str, ...]  # "ptr" or "int32", in the kernel's parameter order
    dyn_smem: int
    pdl: bool

    def __post_init__(self):
        self._functions: dict[int, ctypes.c_void_p] = {}
        self._modules: list[ctypes.c_void_p] = []

    def _function(self, device: int) -> ctypes.c_void_p:
        fn = self._functions.get(device)
        if fn is None:
            cu = driver()
            torch.cuda.init()
            with torch.cuda.device(device):
                _primary_context_current(device)
                module, fn = ctypes.c_void_p(), ctypes.c_void_p()
                check(cu.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(self.image)), "cuModuleLoadData")
                check(cu.cuModuleGetFunction(ctypes.byref(fn), module, self.entry.encode()), "cuModuleGetFunction")
                if self.dyn_smem > _STATIC_SMEM_LIMIT:
                    check(cu.cuFuncSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                ctypes.c_int(self.dyn_smem)), "cuFuncSetAttribute")
            self._modules.append(module)  # never unloaded: kernels live as long as the process
            self._functions[device] = fn
        return fn

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], *args) -> None:
        """Launch on torch's current stream: tensors pass their data pointer, ints as int32."""
        if len(args) != len(self.param_types):
            raise TypeError(f"{self.entry} takes {len(self.param_types)} arguments, got {len(args)}")
        device = next(a.device.index for a in args if isinstance(a, torch.Tensor))
        fn = self._function(device)
        values = []
        for kind, arg in zip(self.param_types, args):
            if kind == "ptr":
                assert isinstance(arg, torch.Tensor) and arg.is_cuda, (self.entry, kind)
                values.append(ctypes.c_void_p(arg.data_ptr()))
            else:
                values.append(ctypes.c_int32(int(arg)))
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        attrs = (_LaunchAttribute * 1)()
        attrs[0].id = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attrs[0].value = (1).to_bytes(4, "little") + bytes(60)
        config = _LaunchConfig(*grid, *block, self.dyn_smem,
                               ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream),
                               attrs, 1 if self.pdl else 0)
        check(driver().cuLaunchKernelEx(ctypes.byref(config), fn, params, None), f"launching {self.entry}")
