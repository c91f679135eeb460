"""The profile: what every capture writes and every command reads (schema dsv4opt.profile/1).

A profile is plain JSON so other tools can read it; this module is the only place that knows its
shape. Required fields follow the contract in docs/profile-schema.md; everything else is optional
and passes through untouched.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4opt.analysis.categories import CATEGORIES, GLUE
from dsv4opt.errors import ProfileError
from dsv4opt.fileio import write_json_atomic

SCHEMA = "dsv4opt.profile/1"
KERNEL_FIELDS = ("name", "category", "count", "total_us", "share")
CATEGORY_FIELDS = ("category", "count", "total_us", "share")


@dataclass
class Profile:
    """One analysed capture.

    time_basis is "gpu" when totals are GPU kernel time, "cpu_self" when the trace had no GPU work
    and the ranking is over CPU operators by self time (labelled as such everywhere).
    """

    meta: dict[str, Any]
    gpu_time_us: float
    kernels: list[dict[str, Any]]
    categories: list[dict[str, Any]]
    steps: dict[str, Any] | None = None
    throughput: dict[str, float] | None = None
    time_basis: str = "gpu"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def top_kernel(self) -> dict[str, Any] | None:
        return self.kernels[0] if self.kernels else None

    @property
    def top_category(self) -> dict[str, Any] | None:
        return max(self.categories, key=lambda c: c["total_us"]) if self.categories else None

    def category_share(self, name: str) -> float:
        return sum(c["share"] for c in self.categories if c["category"] == name)

    @property
    def glue_share(self) -> float:
        return sum(c["share"] for c in self.categories if c["category"] in GLUE)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "meta": self.meta,
            "time_basis": self.time_basis,
            "gpu_time_us": self.gpu_time_us,
            "kernels": self.kernels,
            "categories": self.categories,
        }
        if self.steps is not None:
            out["steps"] = self.steps
        if self.throughput is not None:
            out["throughput"] = self.throughput
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "<profile>") -> "Profile":
        if not isinstance(data, dict):
            raise ProfileError(f"{source}: not a dsv4opt profile (expected a JSON object)")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise ProfileError(
                f"{source}: unknown profile schema {schema!r}; this dsv4opt reads {SCHEMA!r}"
            )
        try:
            kernels = list(data["kernels"])
            categories = list(data["categories"])
            gpu_time_us = float(data["gpu_time_us"])
            meta = dict(data.get("meta") or {})
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{source}: profile is missing or has a malformed field ({exc})") from None
        for row in kernels:
            _require_fields(row, KERNEL_FIELDS, source, "kernel")
        for row in categories:
            _require_fields(row, CATEGORY_FIELDS, source, "category")
            if row["category"] not in CATEGORIES:
                raise ProfileError(f"{source}: unknown category {row['category']!r}")
        known = {"schema", "meta", "time_basis", "gpu_time_us", "kernels", "categories", "steps", "throughput"}
        return cls(
            meta=meta,
            gpu_time_us=gpu_time_us,
            kernels=kernels,
            categories=categories,
            steps=data.get("steps"),
            throughput=data.get("throughput"),
            time_basis=data.get("time_basis", "gpu"),
            extra={k: v for k, v in data.items() if k not in known},
        )

    def save(self, path: str | Path) -> Path:
        return write_json_atomic(path, _finite(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ProfileError(f"{path}: no such profile") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ProfileError(f"{path}: cannot read profile ({exc.__class__.__name__})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        return cls.from_dict(data, source=str(path))


def is_profile_file(path: str | Path) -> bool:
    """True when `path` is a JSON file whose top-level object names our schema (cheap sniff)."""
    path = Path(path)
    if path.suffix != ".json" or not path.is_file():
        return False
    with path.open("rb") as f:
        head = f.read(4096)
    return b'"schema"' in head and SCHEMA.encode() in head


def _require_fields(row: Any, names: tuple[str, ...], source: str, what: str) -> None:
    if not isinstance(row, dict) or any(n not in row for n in names):
        raise ProfileError(f"{source}: a {what} row lacks one of {', '.join(names)}")


def _finite(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null rather than producing invalid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
