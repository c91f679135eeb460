"""`dsv4opt build-kernels`: fetch and compile SGLang 0.5.23's Hopper kernels into the cache.

What each family needs, and what the build does (sizes and times: docs/production-kernels.md):

- DeepGEMM: the `vllm==0.23.0` wheel (274 MB, downloaded once); its `vllm/third_party/deep_gemm`
  (DeepGEMM 2.5.0, relative imports) is unpacked as `deep_gemm/` with only the CPython 3.12 `_C`.
  Nothing is compiled here: DeepGEMM compiles each kernel on the GPU machine at first use.
- Marlin: the `sglang==0.5.23` wheel's JIT sources (kernels/jit/csrc, include) and the
  `apache-tvm-ffi==0.1.11` cp312 wheel; nvcc builds the two specialisations SGLang's
  `fused_marlin_moe` uses into tvm-ffi modules, with the wrapper, flags and link line SGLang's
  `load_jit` would use on an sm_90 GPU (kernels/jit/utils/compile/spec.py `_wrapper_source`,
  toolchain.py, arch.py, ninja.py). About 7 minutes each on 2 cores; they build side by side.
- TileLang mHC: SGLang's mhc.py from the same wheel, lowered to sm_90a cubins by
  tilelang_aot.py under a Python that has `tilelang==0.1.12` (--tilelang-python).

Each family is built in a staging folder and renamed into place with its manifest, so an
interrupted build leaves nothing that looks finished; a family already built is skipped unless
`force`. Wheels are looked for in `wheels`, the cache's downloads/ and ~/.cache/dsv4opt/wheels
before pip downloads them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from dsv4opt.errors import DsvOptError
from dsv4opt.fileio import check_new_file
from dsv4opt.workload.production.artefacts import (
    DEEPGEMM, FAMILIES, MANIFEST, MARLIN, MHC, SGLANG_VERSION, TVM_FFI, cache_dir, find_nvcc, present,
)

VLLM = ("vllm", "0.23.0")
SGLANG = ("sglang", SGLANG_VERSION)
TVM_FFI_WHEEL = ("apache-tvm-ffi", "0.1.11")
DEEPGEMM_DIR = "vllm/third_party/deep_gemm/"
CP312 = "cpython-312"
CP312_PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                  "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                  "--platform", "manylinux2014_x86_64"]
# vllm 0.23.0's wheel is cp38-abi3 manylinux_2_28; ask for the platform, not this interpreter's.
ANY_PYTHON_PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                       "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_34_x86_64"]

# The template arguments of the two moe_wna16_marlin_gemm calls in fused_marlin_moe
# (srt/layers/moe/fused_moe_triton/fused_marlin_moe.py:315-347, 379-406) without expert parallelism:
# <dtype, is_ep, has_bias, expert_ids_are_sorted, zero_inactive_output, has_inactive_prefix_count>.
MARLIN_SPECS = {
    "gemm1": "bf16_t, false, false, true, false, true",
    "gemm2": "bf16_t, false, false, true, true, true",
}
# SGLang's load_jit on an sm_90 GPU: toolchain.base_cuda_flags + target_flags, then
# arch.get_default_target_flags (kernels/jit/utils/compile/toolchain.py, arch.py).
MARLIN_NVCC_FLAGS = ["-Xcompiler", "-fPIC", "-gencode=arch=compute_90a,code=sm_90a", "-DSGL_CUDA_ARCH=900",
                     "-std=c++20", "-O3", "--expt-relaxed-constexpr"]
# What tvm-ffi's generated units include first (spec.py `_FFI_INCLUDES`).
FFI_INCLUDES = ("tvm/ffi/container/tensor.h", "tvm/ffi/dtype.h", "tvm/ffi/error.h", "tvm/ffi/extra/c_env_api.h",
                "tvm/ffi/function.h")
MARLIN_SOURCE = "gemm/marlin_moe/moe_wna16_marlin.cuh"
MHC_SOURCE = "sglang/kernels/ops/layernorm/mhc.py"
PACK_NAME = f"sglang-{SGLANG_VERSION}-kernels.tar.gz"


@dataclass
class Step:
    what: str
    seconds: float
    note: str = ""


@dataclass
class BuildLog:
    say: Callable[[str], None] = print
    steps: list[Step] = field(default_factory=list)

    def done(self, what: str, start: float, note: str = "") -> None:
        step = Step(what, time.perf_counter() - start, note)
        self.steps.append(step)
        self.say(f"{what}: {step.seconds:.1f} s{' (' + note + ')' if note else ''}")


def build_kernels(only: list[str] | None = None, cache: Path | None = None, wheels: Path | None = None,
                  tilelang_python: str | None = None, force: bool = False,
                  say: Callable[[str], None] = print) -> list[Step]:
    """Build the families named in `only` (default: all three) into the cache; returns the steps."""
    keys = [f.key for f in FAMILIES]
    only = list(dict.fromkeys(only or keys))
    unknown = [k for k in only if k not in keys]
    if unknown:
        raise DsvOptError(f"unknown kernel family {', '.join(unknown)}; use {', '.join(keys)}")
    cache = cache or cache_dir()
    if cache.exists() and not cache.is_dir():
        raise DsvOptError(f"{cache} is a file; point DSV4OPT_KERNEL_CACHE at a folder")
    todo = [k for k in only if force or not present(k, cache)]
    if MARLIN in todo and (force or not present(TVM_FFI, cache)):
        todo.insert(todo.index(MARLIN), TVM_FFI)
    # Refuse before downloading anything: the tools each family needs.
    nvcc = find_nvcc()
    if MARLIN in todo and nvcc is None:
        raise DsvOptError("building Marlin needs nvcc (CUDA 12.8 or later): set CUDA_HOME or put nvcc on PATH, "
                          "or build the others only (--only deep_gemm,mhc)")
    log = BuildLog(say)
    if MHC in todo:
        tilelang_python = _check_tilelang_python(tilelang_python or os.environ.get("DSV4OPT_TILELANG_PYTHON")
                                                 or _tilelang_venv(cache / TILELANG_VENV, wheels, log))
    for key in only:
        if key not in todo:
            say(f"{key}: already in {cache / key} (--force rebuilds it)")
    cache.mkdir(parents=True, exist_ok=True)
    finders = _WheelFinder(cache / "downloads", wheels, log)
    for key in todo:
        if key == DEEPGEMM:
            _publish(cache, key, force, log, lambda d: _deep_gemm(d, finders.get(*VLLM, ANY_PYTHON_PLATFORM), log))
        elif key == TVM_FFI:
            _publish(cache, key, force, log, lambda d: _tvm_ffi(d, finders.get(*TVM_FFI_WHEEL, CP312_PLATFORM), log))
        elif key == MARLIN:
            sources = _sglang_jit_sources(finders.get(*SGLANG, []), cache / "downloads", log)
            _publish(cache, key, force, log, lambda d: _marlin(d, sources, cache / TVM_FFI, nvcc, log))
        elif key == MHC:
            source = _sglang_file(finders.get(*SGLANG, []), MHC_SOURCE, cache / "downloads")
            _publish(cache, key, force, log, lambda d: _mhc(d, source, tilelang_python, log))
    return log.steps


TILELANG_VENV = "tilelang-venv"
TILELANG_PINS = ("tilelang==0.1.12", "z3-solver<4.15.5")  # SGLang 0.5.23's pin; tilelang's own z3 bound


def _tilelang_venv(venv: Path, wheels: Path | None, log: BuildLog) -> str:
    """A venv of the cache's own with tilelang 0.1.12 (made once): it sees this Python's packages (a
    .pth file), so tilelang takes the torch installed here (it pins none) instead of downloading another."""
    python = venv / "bin" / "python"
    if python.exists() and _tilelang_version(str(python)) == "0.1.12":
        return str(python)
    start = time.perf_counter()
    log.say(f"mhc: making {venv} for tilelang 0.1.12 (once; it reuses this Python's torch)")
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "-q", *(["--find-links", str(wheels)] if wheels else []),
              *TILELANG_PINS]]
    for i, cmd in enumerate(steps):
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise DsvOptError(f"could not make the tilelang venv ({' '.join(cmd[:4])}: {_last_line(run.stderr)}); "
                              "give a Python with tilelang 0.1.12 (--tilelang-python), or build the others only "
                              "(--only deep_gemm,marlin)")
        if i == 0:
            _see_these_packages(venv)
    log.done("tilelang venv", start)
    return str(python)


def _see_these_packages(venv: Path) -> None:
    """A .pth in the new venv naming this interpreter's site-packages, after its own: pip there then
    finds the torch installed here (a venv made with --system-site-packages from inside another venv
    would see the base interpreter's packages, not this one's)."""
    import site

    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    own = venv / "lib" / version / "site-packages"
    own.mkdir(parents=True, exist_ok=True)
    here = [p for p in (*site.getsitepackages(), site.getusersitepackages()) if Path(p).is_dir()]
    (own / "dsv4opt-host-packages.pth").write_text("".join(f"{p}\n" for p in here))


def _tilelang_version(python: str) -> str | None:
    probe = subprocess.run([python, "-c", "import tilelang; print(tilelang.__version__)"], capture_output=True,
                           text=True)
    return probe.stdout.strip() if probe.returncode == 0 else None


def _check_tilelang_python(python: str) -> str:
    hint = ("a venv of its own: python -m venv V && V/bin/pip install tilelang==0.1.12 'z3-solver<4.15.5' torch; "
            "then --tilelang-python V/bin/python, or build the others only (--only deep_gemm,marlin)")
    probe = subprocess.run([python, "-c", "import tilelang; print(tilelang.__version__)"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        raise DsvOptError(f"{python} cannot import tilelang ({_last_line(probe.stderr)}); {hint}")
    if probe.stdout.strip() != "0.1.12":
        raise DsvOptError(f"{python} has tilelang {probe.stdout.strip()}; SGLang 0.5.23 pins 0.1.12 ({hint})")
    return python


class _WheelFinder:
    """A wheel by name and version: from --wheels, the cache's downloads/, the project's wheel cache,
    else `pip download` into downloads/."""

    def __init__(self, downloads: Path, wheels: Path | None, log: BuildLog):
        self.downloads, self.log = downloads, log
        project = Path.home() / ".cache" / "dsv4opt" / "wheels"
        self.places = [p for p in (wheels, downloads) if p is not None] + sorted(project.glob("*"))

    def get(self, name: str, version: str, platform: list[str]) -> Path:
        stem = f"{name.replace('-', '_')}-{version}-"
        for place in self.places:
            found = sorted(place.glob(f"{stem}*.whl")) if place.is_dir() else []
            if found:
                return found[0]
        start = time.perf_counter()
        self.downloads.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               *platform, "-d", str(self.downloads), f"{name}=={version}"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(self.downloads.glob(f"{stem}*.whl"))
        if run.returncode != 0 or not found:
            raise DsvOptError(f"could not download {name}=={version} ({_last_line(run.stderr)}); put the wheel "
                              f"in a folder and pass --wheels FOLDER")
        self.log.done(f"download {found[0].name}", start, _size(found[0]))
        return found[0]


def _publish(cache: Path, key: str, force: bool, log: BuildLog, make: Callable[[Path], dict]) -> None:
    """Build `key` into a staging folder, write its manifest last, rename it into place."""
    staging = cache / f".staging-{key}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    start = time.perf_counter()
    try:
        info = make(staging)
        files = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
        info.update(family=key, files=files, bytes=sum((staging / f).stat().st_size for f in files),
                    built=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    seconds=round(time.perf_counter() - start, 1))
        (staging / MANIFEST).write_text(json.dumps(info, indent=1) + "\n")
        final = cache / key
        old = None
        if final.exists():
            old = cache / f".old-{key}-{uuid.uuid4().hex[:8]}"
            final.rename(old)
        staging.rename(final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.done(f"{key} -> {cache / key}", start, f"{info['bytes'] / 1e6:.1f} MB")


def _deep_gemm(out: Path, wheel: Path, log: BuildLog) -> dict:
    start = time.perf_counter()
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.startswith(DEEPGEMM_DIR) and _keep_deep_gemm(m[len(DEEPGEMM_DIR):])]
        if f"{DEEPGEMM_DIR}__init__.py" not in members:
            raise DsvOptError(f"{wheel.name} holds no {DEEPGEMM_DIR}; is it vllm 0.23.0's wheel?")
        for m in members:
            target = out / m[len(DEEPGEMM_DIR):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(m))
    version = _version_of(out / "__init__.py")
    if version != "2.5.0":
        raise DsvOptError(f"{wheel.name} bundles DeepGEMM {version}; SGLang's Hopper path was modelled on 2.5.0")
    log.done(f"deep_gemm {version} from {wheel.name}", start)
    return {"version": version, "source": _source(wheel)}


def _keep_deep_gemm(rel: str) -> bool:
    """The package minus other Pythons' `_C` builds and bytecode."""
    name = rel.rsplit("/", 1)[-1]
    if "__pycache__" in rel or not rel:
        return False
    return not (name.startswith("_C.cpython-") and CP312 not in name)


def _tvm_ffi(out: Path, wheel: Path, log: BuildLog) -> dict:
    start = time.perf_counter()
    with zipfile.ZipFile(wheel) as z:
        z.extractall(out)
    (out / wheel.name).write_bytes(wheel.read_bytes())  # the wheel itself, for a pip install where wanted
    log.done(f"apache-tvm-ffi from {wheel.name}", start)
    return {"version": TVM_FFI_WHEEL[1], "source": _source(wheel)}


def _sglang_jit_sources(wheel: Path, downloads: Path, log: BuildLog) -> Path:
    """sglang/kernels/jit/{csrc,include} of the wheel, unpacked once into downloads/."""
    root = downloads / f"sglang-{SGLANG_VERSION}-jit"
    if (root / "include").is_dir() and (root / "csrc" / MARLIN_SOURCE).is_file():
        return root
    start = time.perf_counter()
    downloads.mkdir(parents=True, exist_ok=True)
    tmp = downloads / f".tmp-{uuid.uuid4().hex[:8]}"
    prefix = "sglang/kernels/jit/"
    with zipfile.ZipFile(wheel) as z:
        for m in z.namelist():
            rel = m[len(prefix):]
            if m.startswith(prefix) and rel.split("/", 1)[0] in ("csrc", "include") and not m.endswith("/"):
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(z.read(m))
    if not (tmp / "csrc" / MARLIN_SOURCE).is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        raise DsvOptError(f"{wheel.name} has no kernels/jit/csrc/{MARLIN_SOURCE}; is it sglang {SGLANG_VERSION}'s wheel?")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    log.done(f"SGLang JIT sources from {wheel.name}", start)
    return root


def _sglang_file(wheel: Path, member: str, downloads: Path) -> Path:
    target = downloads / f"sglang-{SGLANG_VERSION}-{Path(member).name}"
    if not target.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            target.write_bytes(z.read(member))
    return target


def marlin_wrapper(header: Path, spec: str) -> str:
    """The translation unit SGLang's load_jit generates for one Marlin specialisation (spec.py
    `_wrapper_source`): tvm-ffi's headers, the kernel header, one typed export."""
    lines = [f"#include <{h}>" for h in FFI_INCLUDES]
    lines += [f'#include "{header}"', "namespace sglang {",
              f"TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_wna16_marlin_gemm, (moe_wna16_marlin_gemm<{spec}>));",
              "}  // namespace sglang"]
    return "\n".join(lines) + "\n"


def cuda_lib_dir(nvcc: str) -> Path:
    """The folder with libcudart.so next to the nvcc in use."""
    home = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "")
    candidates = [home] if str(home) not in ("", ".") else []
    candidates += [Path(nvcc).resolve().parent.parent, Path("/usr/local/cuda")]
    for root in candidates:
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib"):
            if (root / sub / "libcudart.so").exists():
                return root / sub
    raise DsvOptError(f"no libcudart.so next to {nvcc}; set CUDA_HOME to the CUDA toolkit's folder")


def _marlin(out: Path, jit: Path, tvm: Path, nvcc: str, log: BuildLog) -> dict:
    tvm_pkg = tvm / "tvm_ffi"
    includes = [tvm_pkg / "include", tvm_pkg / "3rdparty" / "dlpack" / "include", jit / "include"]
    link = ["-shared", f"-L{tvm_pkg / 'lib'}", "-ltvm_ffi", f"-L{cuda_lib_dir(nvcc)}", "-lcudart"]
    work = out / ".work"
    work.mkdir()
    procs = {}
    start = time.perf_counter()
    for name, spec in MARLIN_SPECS.items():
        unit = work / f"{name}.cu"
        unit.write_text(marlin_wrapper(jit / "csrc" / MARLIN_SOURCE, spec))
        cmd = [nvcc, *MARLIN_NVCC_FLAGS, *[f"-I{p}" for p in includes], "-c", str(unit), "-o", str(work / f"{name}.o")]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    say_flags = " ".join(MARLIN_NVCC_FLAGS)
    log.say(f"marlin: nvcc {say_flags} on {len(procs)} specialisations, side by side (6 to 16 minutes on 2 cores)")
    for name, proc in procs.items():
        output = proc.communicate()[0]
        if proc.returncode != 0:
            for other in procs.values():
                other.kill()
            raise DsvOptError(f"nvcc failed on Marlin {name} ({_last_line(output)}); full command: "
                              f"{' '.join(map(str, proc.args))}")
        so = out / f"moe_wna16_marlin_{name}.so"
        run = subprocess.run(["c++", str(work / f"{name}.o"), *link, "-o", str(so)], capture_output=True, text=True)
        if run.returncode != 0:
            raise DsvOptError(f"linking Marlin {name} failed ({_last_line(run.stderr)})")
        log.done(f"marlin {name} <{MARLIN_SPECS[name]}>", start, _size(so))
    shutil.rmtree(work)
    nvcc_version = _last_line(subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout)
    return {"specs": {f"moe_wna16_marlin_{k}.so": v for k, v in MARLIN_SPECS.items()}, "nvcc": nvcc_version,
            "flags": MARLIN_NVCC_FLAGS, "source": f"sglang {SGLANG_VERSION} kernels/jit/csrc/{MARLIN_SOURCE}"}


def _mhc(out: Path, source: Path, python: str, log: BuildLog) -> dict:
    start = time.perf_counter()
    script = Path(__file__).with_name("tilelang_aot.py")
    run = subprocess.run([python, str(script), "--mhc-source", str(source), "--out", str(out)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise DsvOptError(f"lowering SGLang's TileLang mHC kernels failed ({_last_line(run.stderr)})")
    for line in run.stdout.splitlines():
        log.say(f"mhc: {line}")
    log.done("mhc cubins", start)
    return {"source": {"file": MHC_SOURCE, "sha256": _sha256(source)}}


def pack(out: Path, cache: Path | None = None, force: bool = False) -> Path:
    """One tar.gz of every built family (downloads left out), for a machine without the network:
    unpack it into that machine's cache folder."""
    cache = cache or cache_dir()
    check_new_file(out, force, "--pack")
    keys = [k for k in (DEEPGEMM, TVM_FFI, MARLIN, MHC) if present(k, cache)]
    if not keys:
        raise DsvOptError(f"nothing built in {cache} to pack; run `dsv4opt build-kernels` first")
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for key in keys:
                tar.add(cache / key, arcname=key)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def unpack(archive: Path, cache: Path | None = None) -> list[str]:
    """The inverse of `pack` (what the GPU machine runs): families already present are left alone."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    done = []
    with tarfile.open(archive) as tar:
        keys = sorted({m.name.split("/", 1)[0] for m in tar.getmembers()})
        for key in keys:
            if present(key, cache):
                continue
            staging = cache / f".staging-{key}-{uuid.uuid4().hex[:8]}"
            members = [m for m in tar.getmembers() if m.name == key or m.name.startswith(key + "/")]
            tar.extractall(staging, members=members, filter="data")
            shutil.rmtree(cache / key, ignore_errors=True)
            (staging / key).rename(cache / key)
            shutil.rmtree(staging, ignore_errors=True)
            done.append(key)
    return done


def _version_of(init: Path) -> str:
    for line in init.read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("'\"")
    return "unknown"


def _source(wheel: Path) -> dict:
    return {"wheel": wheel.name, "sha256": _sha256(wheel)}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def _last_line(text: str | None) -> str:
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    return lines[-1] if lines else "no output"
