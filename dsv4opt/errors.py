"""User-facing errors. Each message says what is wrong and how to fix it; cli.py prints it as one line."""


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
