"""The one place tests reach into benchmarks/: the scripts and sources there are tested as files of
the checkout (the product never loads them). Everything else a test needs comes from the package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tests.helpers import REPO

BENCHMARKS = REPO / "benchmarks"


def path(name: str) -> Path:
    """benchmarks/NAME, e.g. "probe_cluster_merge.cu" or "anchor_flashmla/shim.cu"."""
    return BENCHMARKS / name


def load_script(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module (its `main` not run)."""
    spec = importlib.util.spec_from_file_location(name, path(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
