"""Re-create the settings of an earlier embedded capture from its profile, so a re-profile matches it."""

from __future__ import annotations

from pathlib import Path

from dsv4opt.analysis.profile import Profile
from dsv4opt.capture.settings import EmbeddedSettings
from dsv4opt.errors import DsvOptError


def settings_from_profile(profile: Profile, source: str | Path = "profile") -> EmbeddedSettings:
    meta = profile.meta
    if meta.get("target") != "embedded":
        raise DsvOptError(
            f"{source}: re-profiling needs an embedded-workload profile (this one is target "
            f"{meta.get('target')!r}); pass --concurrency to profile afresh"
        )
    return EmbeddedSettings.from_meta(meta)
