"""JSON we read back (project state, profiles, sweep summaries), checked against its schema on load.

msgspec does the checking; this module turns what it finds into the one line the CLI prints: the
file, the field and what was expected (`state.json: checks.bf16-gemm: expected object, got str`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from dsv4opt.errors import DsvOptError

T = TypeVar("T")

# msgspec's messages: "Expected `int`, got `str` - at `$.meta.concurrency`",
# "Object missing required field `name` - at `$.kernels[0]`".
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")


def read_json(path: str | Path, error: type[DsvOptError], what: str, hint: str = "") -> Any:
    """The parsed JSON in `path`; a missing, unreadable or malformed file is one `error` line
    (ending in `hint`, the way out, when given)."""
    path = Path(path)
    tail = f"; {hint}" if hint else ""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read {what} ({exc.__class__.__name__}){tail}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg}){tail}") from None


def convert(data: Any, type_: type[T], source: str, error: type[DsvOptError], at: str = "", hint: str = "") -> T:
    """`data` as `type_` (a msgspec Struct, or a container of them), or one `error` line naming the
    field that does not fit; `at` names where `data` sits in the file (e.g. "meta")."""
    try:
        return msgspec.convert(data, type_)
    except msgspec.ValidationError as exc:
        raise error(f"{source}: {_field_message(str(exc), at)}" + (f"; {hint}" if hint else "")) from None


def _field_message(message: str, at: str) -> str:
    match = _AT.match(message)
    what, path = match["what"], (match["path"] or "").lstrip(".")
    missing = _MISSING.match(what)
    if missing:
        path = f"{path}.{missing['name']}" if path else missing["name"]
        what = "missing (a required field)"
    where = ".".join(p for p in (at, path) if p).replace(".[", "[")
    what = what.replace("`", "").replace(" | ", " or ")
    what = what[:1].lower() + what[1:]
    return f"{where}: {what}" if where else what
