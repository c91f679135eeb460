"""Where SGLang 0.5.23's own Hopper kernels live once built, and whether each family can run here.

The cache folder is `$DSV4OPT_KERNEL_CACHE`, else `~/.cache/dsv4opt/sglang-0.5.23`. `dsv4opt
build-kernels` fills it (dsv4opt/workload/production/build.py); each family sits in a folder of its
own with a `manifest.json` that the build writes last, so a folder without one is an interrupted
build, never a finished one:

    deep_gemm/       DeepGEMM 2.5.0 as vllm 0.23.0 bundles it (CPython 3.12 `_C` only): imported as
                     `deep_gemm`, it JIT-compiles each kernel at first use with nvcc or NVRTC
    tvm-ffi/         apache-tvm-ffi 0.1.11 (cp312 abi3) unpacked: what loads Marlin's `.so` where
                     `import tvm_ffi` finds no installed copy
    marlin/          SGLang's `moe_wna16_marlin_gemm`, the two specialisations `fused_marlin_moe` uses
    mhc/             SGLang's TileLang mHC kernels lowered to sm_90a cubins, one per variant, and how
                     to launch each (entry, parameters, grid, block, dynamic shared memory)
    downloads/       the wheels the build read (not needed to run; safe to delete)

`availability()` says for each family whether the real kernel runs here, or in one line why the
stand-in runs instead and how to change that.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "DSV4OPT_KERNEL_CACHE"
SGLANG_VERSION = "0.5.23"
MANIFEST = "manifest.json"

DEEPGEMM, MARLIN, MHC, TVM_FFI = "deep_gemm", "marlin", "mhc", "tvm-ffi"
DEEPGEMM_PYTHON = (3, 12)  # the only `_C` build kept from the wheel (the GPU machine's Python)
TVM_FFI_PYTHON = (3, 12)  # the apache-tvm-ffi wheel kept is cp312-abi3: CPython 3.12 and later


@dataclass(frozen=True)
class Family:
    """One family of SGLang kernels the Hopper path runs."""

    key: str  # its folder in the cache
    title: str  # how a status line names it
    stands_in: str  # our kernel that runs when this one cannot
    needs: tuple[str, ...] = ()  # other cache folders it loads through


FAMILIES = (
    Family(DEEPGEMM, "DeepGEMM (FP8 GEMM, paged MQA logits, tf32 hc pre-norm GEMM)",
           "Triton block-FP8 GEMM, indexer_tc, hc_pre_gemm"),
    Family(MARLIN, "Marlin MoE (moe_wna16_marlin_gemm)", "grouped_moe", needs=(TVM_FFI,)),
    Family(MHC, "TileLang mHC (big fuse with norm, post+pre FMA, post)", "mhc_fused / mhc Triton kernels"),
)


def cache_dir() -> Path:
    """The cache folder: $DSV4OPT_KERNEL_CACHE, else ~/.cache/dsv4opt/sglang-0.5.23."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "dsv4opt" / f"sglang-{SGLANG_VERSION}"


def read_manifest(folder: Path) -> dict | None:
    """A family folder's manifest, or None when the folder is absent or its build never finished."""
    try:
        return json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def present(key: str, cache: Path | None = None) -> bool:
    """Whether a finished build of `key` is in the cache, every file its manifest lists included."""
    folder = (cache or cache_dir()) / key
    manifest = read_manifest(folder)
    return manifest is not None and all((folder / f).is_file() for f in manifest.get("files", []))


@dataclass(frozen=True)
class Availability:
    family: Family
    ready: bool
    reason: str  # why the stand-in runs (empty when ready)

    def line(self) -> str:
        """One line for a status table or a profile's meta."""
        name = self.family.title.split(" (")[0]
        if self.ready:
            return f"{name}: SGLang {SGLANG_VERSION}'s kernel"
        return f"{name}: stand-in ({self.reason})"


@dataclass(frozen=True)
class Machine:
    """What decides whether a built kernel can run: the GPU, the compiler DeepGEMM needs, Python."""

    capability: tuple[int, int] | None  # of the current CUDA device; None without one
    nvcc: str | None  # what DeepGEMM would compile with (CUDA_HOME/bin/nvcc or nvcc on PATH)
    python: tuple[int, int]

    @classmethod
    def here(cls) -> "Machine":
        capability = None
        try:
            import torch

            if torch.cuda.is_available():
                capability = tuple(torch.cuda.get_device_capability())
        except Exception:  # a broken CUDA install reads as "no GPU", which is what it amounts to
            capability = None
        return cls(capability, find_nvcc(), sys.version_info[:2])


def find_nvcc() -> str | None:
    """nvcc as DeepGEMM and SGLang's JIT look for it: $CUDA_HOME (or $CUDA_PATH)/bin/nvcc, else PATH."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        candidate = Path(home) / "bin" / "nvcc"
        return str(candidate) if candidate.is_file() else None
    return shutil.which("nvcc")


def find_cuda_home(usual: tuple[str, ...] = ("/usr/local/cuda",)) -> str | None:
    """The CUDA toolkit's folder (include/cuda.h inside): $CUDA_HOME, /usr/local/cuda, else the nvcc
    on PATH followed through symlinks and a wrapper script's `exec /path/bin/nvcc`. DeepGEMM's own
    guess, dirname(dirname(which nvcc)), is wrong for such a wrapper."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [Path(home)] if home else []
    candidates += [Path(u) for u in usual]
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve()
        candidates.append(real.parent.parent)
        try:
            text = real.read_text(errors="ignore")[:4096] if real.stat().st_size < 4096 else ""
        except OSError:
            text = ""
        candidates += [Path(w).parent.parent for w in text.split() if w.startswith("/") and w.endswith("/nvcc")]
    for root in candidates:
        if (root / "include" / "cuda.h").is_file() and (root / "bin" / "nvcc").is_file():
            return str(root)
    return None


def availability(cache: Path | None = None, machine: Machine | None = None) -> list[Availability]:
    """For each family: does SGLang's kernel run here, or why does the stand-in (one line each)."""
    cache = cache or cache_dir()
    machine = machine or Machine.here()
    out = []
    for family in FAMILIES:
        out.append(Availability(family, *_check(family, cache, machine)))
    return out


def _check(family: Family, cache: Path, machine: Machine) -> tuple[bool, str]:
    missing = [key for key in (family.key, *family.needs) if not present(key, cache)]
    if missing:
        return False, f"no {'/'.join(missing)} build in {cache}; run `dsv4opt build-kernels`"
    if machine.capability is None:
        return False, "no CUDA GPU here"
    if machine.capability != (9, 0):
        major, minor = machine.capability
        return False, f"built for Hopper (sm_90a); this GPU is sm_{major}{minor}"
    if family.key == DEEPGEMM:
        if machine.python != DEEPGEMM_PYTHON:
            want = ".".join(map(str, DEEPGEMM_PYTHON))
            have = ".".join(map(str, machine.python))
            return False, f"the cached DeepGEMM _C is built for CPython {want}; this is {have}"
        if machine.nvcc is None:
            return False, "DeepGEMM compiles its kernels at first use: set CUDA_HOME or put nvcc on PATH"
    if family.key == MARLIN and machine.python < TVM_FFI_PYTHON:
        want = ".".join(map(str, TVM_FFI_PYTHON))
        return False, f"the cached apache-tvm-ffi is a cp{want.replace('.', '')}-abi3 build; this is CPython {machine.python[0]}.{machine.python[1]}"
    return True, ""


def status_lines(cache: Path | None = None, machine: Machine | None = None) -> list[str]:
    return [a.line() for a in availability(cache, machine)]
