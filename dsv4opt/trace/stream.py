"""Stream the events of a chrome-trace JSON file without holding the whole document in memory.

json.load on a 300 MB trace builds every event dict at once (several GB). Here a sliding text window
is cut at event boundaries and each run of whole events is decoded at once by msgspec into `Event`
structs holding only the fields the reader uses (the rest is skipped without building it), so peak
memory is the window plus whatever the caller keeps. Near the window's edge, and wherever a run does
not decode, events are read one at a time with the standard json scanner, which also gives the
one-line error for corrupt input. Gzip is detected by its magic bytes, not by the file name.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from pathlib import Path
from typing import Any, Callable

import msgspec

from dsv4opt.errors import TraceError

CHUNK_CHARS = 1 << 20
MAX_VALUE_CHARS = 16 << 20

_SKIP = re.compile(r"[ \t\n\r]*")
_SKIP_COMMA = re.compile(r"[ \t\n\r]*,?[ \t\n\r]*")
# Where one event may end and the next begin. A match inside a string or a nested value is not a
# boundary, but then the run up to it does not decode as a list of whole events, so a run that does
# decode ends at a real boundary.
_BOUNDARY = re.compile(r"\}[ \t\n\r]*,[ \t\n\r]*\{")
_scan_once = json.JSONDecoder().scan_once


_NULL = msgspec.Raw(b"null")


class Args(msgspec.Struct, gc=False):
    """The `args` keys the reader uses; any other key is skipped unread. An operator's recorded
    shapes stay JSON text (decoded by the reader for the few operators it models: building every
    call's nested lists was a sixth of the decoding). Not tracked by the cyclic collector (gc=False),
    as Event: decoded JSON holds no cycles, and tracking every event cost 7% of decoding."""

    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    device: Any = None
    kernel: Any = None
    name: Any = None
    input_dims: msgspec.Raw = msgspec.field(default=_NULL, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NULL, name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NULL, name="Concrete Inputs")


class Event(msgspec.Struct, gc=False):
    """One trace event, fields as in the file (None when absent); `args` is None unless an object."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    id: Any = None
    args: Args | None = None


_RUN = msgspec.json.Decoder(list[Event])
_ARG_FIELDS = {f.encode_name: f.name for f in msgspec.structs.fields(Args)}
_RAW_ARGS = frozenset(f.name for f in msgspec.structs.fields(Args) if f.type is msgspec.Raw)
_EVENT_FIELDS = tuple(f.name for f in msgspec.structs.fields(Event) if f.name != "args")


def event_of(d: dict) -> Event:
    """An Event from a decoded dict (the one-at-a-time path), `args` kept only when an object."""
    a = d.get("args")
    args = Args(**{_ARG_FIELDS[k]: _arg(_ARG_FIELDS[k], v) for k, v in a.items() if k in _ARG_FIELDS}) \
        if type(a) is dict else None
    return Event(*(d.get(k) for k in _EVENT_FIELDS), args=args)


def _arg(field: str, value: Any) -> Any:
    return msgspec.Raw(msgspec.json.encode(value)) if field in _RAW_ARGS else value


class _Window:
    """A text window over the (decompressed) file with refill and one-line error messages."""

    def __init__(self, path: Path):
        self.path = path
        self._raw = _open_binary(path)
        self._text = io.TextIOWrapper(self._raw, encoding="utf-8", errors="strict")
        self.buf = ""
        self.pos = 0
        self.consumed = 0  # characters dropped from the front, for error positions
        self.eof = False

    def close(self) -> None:
        self._text.close()

    def refill(self) -> bool:
        """Read one more chunk; False at end of file."""
        if self.eof:
            return False
        try:
            more = self._text.read(CHUNK_CHARS)
        except EOFError:
            raise TraceError(f"{self.path}: the gzip stream is truncated; copy the trace again") from None
        except (gzip.BadGzipFile, zlib.error, OSError) as exc:
            raise TraceError(f"{self.path}: cannot decompress ({exc}); is it a .json.gz trace?") from None
        except UnicodeDecodeError:
            raise TraceError(f"{self.path}: not UTF-8 text; is it a chrome-trace JSON file?") from None
        if not more:
            self.eof = True
            return False
        self.consumed += self.pos
        self.buf = self.buf[self.pos :] + more
        self.pos = 0
        return True

    def skip_ws(self, pattern: re.Pattern = _SKIP) -> str:
        """Skip whitespace; return the next character, or "" at end of file."""
        while True:
            self.pos = pattern.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.refill():
                return ""

    def decode_value(self, what: str) -> Any:
        """Decode one JSON value at pos (after whitespace), refilling while it runs past the window."""
        self.skip_ws()
        while True:
            try:
                value, end = _scan_once(self.buf, self.pos)
            except (StopIteration, json.JSONDecodeError) as exc:
                # The C scanner raises StopIteration(position) for "expecting a value".
                at, msg = (exc.value, "expecting a value") if isinstance(exc, StopIteration) else (exc.pos, exc.msg)
                # An error well inside the window is corruption; one at its edge (or an
                # unterminated string, reported at its start) may just need more text.
                inside = at + 64 < len(self.buf) and not msg.startswith("Unterminated string")
                if inside or len(self.buf) - self.pos > MAX_VALUE_CHARS:
                    raise self.error(f"{what} is not valid JSON ({msg})") from None
                if self.refill():
                    continue
                raise TraceError(
                    f"{self.path}: ends in the middle of {what} (truncated or corrupt JSON: {msg})"
                ) from None
            if end >= len(self.buf) and not self.eof and isinstance(value, (int, float)):
                # A number cut by the window edge would decode short; read on and decode again.
                if self.refill():
                    continue
            self.pos = end
            return value

    def expect(self, char: str, what: str) -> None:
        got = self.skip_ws()
        if got != char:
            raise self.error(f"expected {char!r} {what}, found {got or 'end of file'!r}")
        self.pos += 1

    def error(self, message: str) -> TraceError:
        return TraceError(f"{self.path}: {message} at character {self.consumed + self.pos}")


def _open_binary(path: Path):
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a folder; pass the folder itself or its trace files") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot open ({exc.strerror})") from None
    head = f.read(2)
    f.seek(0)
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")
    return f


def stream_trace(path: str | Path, on_events: Callable[[list[Event]], None]) -> dict[str, Any]:
    """Call `on_events(events)` with the entries of traceEvents, in order, a run at a time; return
    the other top-level keys.

    Accepts the object form ({"traceEvents": [...], ...}) and the bare-array form ([...]).
    Raises TraceError (one line: which file, what is wrong) for empty, non-JSON, truncated or
    wrongly shaped input.
    """
    path = Path(path)
    win = _Window(path)
    try:
        first = win.skip_ws()
        if first == "":
            raise TraceError(f"{path}: the file is empty; profile again or pick another trace")
        if first == "[":
            win.pos += 1
            _stream_array(win, on_events)
            return {}
        if first != "{":
            raise TraceError(f"{path}: not a chrome-trace JSON file (it does not start with {{ or [)")
        win.pos += 1
        header: dict[str, Any] = {}
        seen_events = False
        while True:
            c = win.skip_ws(_SKIP_COMMA)
            if c == "}":
                break
            if c != '"':
                if c == "":
                    raise TraceError(f"{path}: ends before the top-level object closes (truncated JSON)")
                raise win.error("expected a key in the top-level object")
            key = win.decode_value("a top-level key")
            win.expect(":", f"after key {key!r}")
            if key == "traceEvents":
                c = win.skip_ws()
                if c != "[":
                    kind = "null" if win.buf.startswith("null", win.pos) else "not a list"
                    raise TraceError(f"{path}: traceEvents is {kind}; this is not a usable profiler trace")
                win.pos += 1
                _stream_array(win, on_events)
                seen_events = True
            else:
                header[key] = win.decode_value(f"the value of {key!r}")
        if not seen_events:
            raise TraceError(f"{path}: has no traceEvents; is it a torch.profiler chrome trace?")
        return header
    finally:
        win.close()


def _stream_array(win: _Window, on_events: Callable[[list[Event]], None]) -> None:
    index = 0
    while True:
        if not win.eof and len(win.buf) - win.pos < CHUNK_CHARS:
            win.refill()
        win.pos = _SKIP_COMMA.match(win.buf, win.pos).end()
        # Hot path: every whole event up to the window's last boundary, decoded at once.
        cut = _last_boundary(win.buf, win.pos, len(win.buf))
        stop = 0
        if cut > win.pos:
            events = _decode_run(win.buf, win.pos, cut)
            if events is not None:
                on_events(events)
                index += len(events)
                win.pos = cut
                continue
            stop = win.consumed + cut
        # Slow path, one event at a time: the event that straddles the window's edge (at least
        # one), the run that did not decode (corrupt input is reported here), the end of the array.
        while True:
            c = win.skip_ws(_SKIP_COMMA)
            if c == "]":
                win.pos += 1
                return
            if c == "":
                raise TraceError(f"{win.path}: ends inside traceEvents after {index} events (truncated JSON)")
            event = win.decode_value(f"event #{index}")
            if type(event) is not dict:
                raise win.error(f"event #{index} is not a JSON object")
            on_events([event_of(event)])
            index += 1
            if win.consumed + win.pos >= stop:
                break


def _decode_run(buf: str, lo: int, hi: int) -> list[Event] | None:
    """The events of buf[lo:hi] (whole events separated by commas), or None when it does not decode."""
    try:
        return _RUN.decode("[" + buf[lo:hi] + "]")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _last_boundary(buf: str, lo: int, hi: int) -> int:
    """Position just after the closing brace of the last event boundary in buf[lo:hi]; lo if none."""
    k = buf.rfind("}", lo, hi)
    while k >= lo:
        if _BOUNDARY.match(buf, k):
            return k + 1
        k = buf.rfind("}", lo, k)
    return lo
