"""Re-create the settings of an earlier embedded capture from its profile, so a re-profile matches it."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from dsv4opt.analysis.profile import Profile
from dsv4opt.capture.settings import EmbeddedSettings
from dsv4opt.errors import DsvOptError

# Profile meta key -> EmbeddedSettings field, where the names differ.
_ALIASES = {"device_kind": "device"}


def settings_from_profile(profile: Profile, source: str | Path = "profile") -> EmbeddedSettings:
    meta = profile.meta
    if meta.get("target") != "embedded":
        raise DsvOptError(
            f"{source}: re-profiling needs an embedded-workload profile (this one is target "
            f"{meta.get('target')!r}); pass --concurrency to profile afresh"
        )
    recorded = dict(meta.get("settings") or {})
    for key, name in _ALIASES.items():
        if key in meta and name not in recorded:
            recorded[name] = meta[key]
    names = {f.name for f in fields(EmbeddedSettings)} - {"out", "trace_dir", "optimizations"}
    for name in names:
        if name not in recorded and name in meta and name != "device":
            recorded[name] = meta[name]
    return EmbeddedSettings(**{k: v for k, v in recorded.items() if k in names})
