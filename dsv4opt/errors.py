"""User-facing errors. Each message says what is wrong and how to fix it; cli.py prints it as one line."""

from difflib import SequenceMatcher
from typing import Iterable


class DsvOptError(Exception):
    """A mistake or condition the user can act on (never a bug in dsv4opt)."""


class TraceError(DsvOptError):
    """A trace file that cannot be read or holds no usable events."""


class ProfileError(DsvOptError):
    """A profile JSON that is missing, corrupt or of an unknown schema."""


class CaptureError(DsvOptError):
    """A capture (embedded workload or SGLang server) that could not run."""


class CheckFailed(DsvOptError):
    """An optimisation's correctness gate failed; nothing was switched on."""


class StateError(DsvOptError):
    """The project state file (.dsv4opt/state.json) is corrupt or inconsistent."""


def close_names(name: str, known: Iterable[str], aliases: dict[str, str] | None = None) -> list[str]:
    """The known names a mistyped one most likely meant ("mma-atn" -> ["mma-attn"]; "tp3" -> ["tp4",
    "tp8"], equally close), none when nothing is close or every name is equally so; `aliases` maps
    words that mean a known name without looking like it ("gpu" -> "cuda")."""
    known = list(known)
    if aliases and name.lower() in aliases:
        return [aliases[name.lower()]]
    scored = {k: SequenceMatcher(None, name.lower(), k.lower()).ratio() for k in known}
    best = max(scored.values(), default=0.0)
    found = [k for k, r in scored.items() if r == best and r >= 0.6]
    return [] if len(found) == len(known) > 1 else found


def unknown_name(what: str, name: str, known: Iterable[str], lead: str = "known:",
                 aliases: dict[str, str] | None = None) -> DsvOptError:
    """"unknown WHAT 'name'; did you mean X? known: a, b" (no guess when no name is close)."""
    known = list(known)
    guess = close_names(name, known, aliases)
    hint = f"; did you mean {' or '.join(guess)}?" if guess else ";"
    return DsvOptError(f"unknown {what} {name!r}{hint} {lead} {', '.join(known)}")
