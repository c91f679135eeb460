"""SGLang 0.5.14's sm_120 decode attention on any GPU (`--force-sm120-path`; refused on 0.5.23, which
decides the sm_120 path process-wide and has a Hopper slot instead): its DeepSeek-V4 backend sends
decode through the sm_120 dispatcher (and so through the Triton entry point the mma-attn drop-in replaces) only where
`deepseek_v4_backend._is_sm120` is true (`deepseek_v4_backend.py:74`, `:126`, `:1419` at 37ef295c7);
elsewhere it runs FlashMLA. Setting that flag lets a Hopper GPU run the sm_120 attention path, SGLang's
kernel or dsv4opt's, inside a real server; the rest of the server keeps its own GPU's kernels.

The flag is set right after SGLang imports the backend module, never by importing it early: the
module asks CUDA for the device's capability when it loads, which must happen after the worker has
chosen its GPU.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

from dsv4opt.optimizations.mma_attn import sglang_contract as C


def after_import(fullname: str, action) -> None:
    """Run action(module) once `fullname` is imported: now if it is, else right after it loads."""
    if fullname in sys.modules:
        action(sys.modules[fullname])
        return
    sys.meta_path.insert(0, _AfterImport(fullname, action))


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, fullname: str, action):
        self.fullname, self.action = fullname, action

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname:
            return None
        sys.meta_path.remove(self)  # one module, once; the other finders locate it
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenRun(spec.loader, self.action)
        return spec


class _ThenRun(importlib.abc.Loader):
    def __init__(self, loader, action):
        self.loader, self.action = loader, action

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.action(module)


def _set_sm120(module) -> None:
    if not hasattr(module, C.BACKEND_SM120_FLAG):
        raise RuntimeError(f"{module.__name__} has no {C.BACKEND_SM120_FLAG}: it is not the backend of {C.WRITTEN_FOR}")
    setattr(module, C.BACKEND_SM120_FLAG, True)


def force() -> None:
    """From now on, this process's DeepSeek-V4 backend takes the sm_120 decode-attention path."""
    after_import(C.BACKEND_MODULE, _set_sm120)
