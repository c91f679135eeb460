"""SGLang's own modules on a CPU, from the PyPI wheel users install, one version at a time.

`pip download --no-deps sglang==X` fetches the wheel into a cache folder (DSV4OPT_WHEELS, default
~/.cache/dsv4opt/wheels; a wheel already there is used as it is); a test that cannot get it skips,
saying why. `WheelModules` then imports modules straight from the wheel: its finder answers for one
top-level package, extracts each file it imports into the cache (Triton reads a kernel's source from
disk) and gives every package an empty module in place of its __init__, which in SGLang imports the
whole server's dependencies. What a module imports must then come from the wheel too, or from a stub
the test names (each stub says what it stands for).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("DSV4OPT_WHEELS", Path.home() / ".cache" / "dsv4opt" / "wheels"))
_unavailable: dict[str, str] = {}  # a wheel that could not be had: asked once per session


def wheel(dist: str, version: str, timeout: int = 600) -> Path:
    """The wheel of dist==version in the cache, downloaded once; skips the test when it cannot be had."""
    stem = dist.replace("-", "_")
    folder = CACHE / f"{stem}-{version}"
    found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    if found:
        return found[0]
    key = f"{dist}=={version}"
    if key not in _unavailable:
        _unavailable[key] = _download(key, folder, timeout)
    found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    if not found:
        pytest.skip(f"cannot download {key} ({_unavailable[key]}); put its wheel in {folder}")
    return found[0]


def _download(requirement: str, folder: Path, timeout: int) -> str:
    """pip download into folder; what went wrong, in one line ("" when nothing did)."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "--retries", "0",
           "--timeout", "20", "-d", str(folder), requirement]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if run.returncode == 0 else (run.stderr.strip().splitlines() or ["pip failed"])[-1]


def source(whl: Path, path: str) -> str:
    """One file of the wheel, as text (`sglang/srt/...py`)."""
    with zipfile.ZipFile(whl) as z:
        return z.read(path).decode("utf-8")


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, owner: "WheelModules"):
        self.owner = owner

    def find_spec(self, fullname, path, target=None):
        o = self.owner
        if fullname != o.top and not fullname.startswith(o.top + "."):
            return None
        if fullname in o.stubs:
            return importlib.util.spec_from_loader(fullname, _Given(o.stubs[fullname]))
        rel = fullname.replace(".", "/")
        if rel in o.folders:  # a package, with or without an __init__
            spec = importlib.util.spec_from_loader(fullname, _Empty(), is_package=True)
            spec.submodule_search_locations = [str(o.root / rel)]
            return spec
        if f"{rel}.py" in o.names:
            return importlib.util.spec_from_file_location(fullname, o.extract(f"{rel}.py"))
        return None


class _Empty(importlib.abc.Loader):
    """A package without its __init__."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        pass


class _Given(importlib.abc.Loader):
    def __init__(self, module):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        pass


class WheelModules:
    """`with WheelModules(whl, "sglang", stubs) as w: w.load("sglang.x.y")`: the wheel's modules under
    their own names, gone from sys.modules again afterwards."""

    def __init__(self, whl: Path, top: str, stubs: dict[str, types.ModuleType] | None = None):
        self.whl, self.top, self.stubs = whl, top, dict(stubs or {})
        self.root = whl.parent / (whl.stem + ".files")
        with zipfile.ZipFile(whl) as z:
            self.names = set(z.namelist())
        self.folders = {n.rsplit("/", i)[0] for n in self.names for i in range(1, n.count("/") + 1)}
        self._finder = _Finder(self)

    def extract(self, rel: str) -> str:
        dest = self.root / rel
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(self.whl) as z:
                tmp = dest.with_suffix(dest.suffix + f".{os.getpid()}.tmp")
                tmp.write_bytes(z.read(rel))
                os.replace(tmp, dest)
        return str(dest)

    def load(self, name: str) -> types.ModuleType:
        return importlib.import_module(name)

    def _ours(self) -> list[str]:
        return [m for m in sys.modules if m == self.top or m.startswith(self.top + ".")]

    def __enter__(self) -> "WheelModules":
        clash = self._ours()
        if clash:
            raise RuntimeError(f"{clash[0]} is already imported: the wheel's modules would mix with it")
        sys.meta_path.insert(0, self._finder)
        return self

    def __exit__(self, *exc) -> None:
        sys.meta_path.remove(self._finder)
        for name in self._ours():
            del sys.modules[name]


def stub(name: str, why: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name, f"test stub: {why}")
    module.__dict__.update(attrs)
    return module
