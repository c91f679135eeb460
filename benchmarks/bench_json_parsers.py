#!/usr/bin/env python3
"""JSON decoders on the same chrome traces: wall, CPU and peak memory, one fresh process per row.

    pip install orjson ijson          # msgspec is a dsv4opt dependency; the others are not
    python benchmarks/bench_json_parsers.py /tmp/dsv4opt-bench/h100-54mb.json /tmp/dsv4opt-bench/h100-500mb.json

Each row decodes every event of traceEvents and sums the `dur` of the GPU events (the check: every
row must give the same count and sum as `dsv4opt.trace.read_trace`; a row that does not is marked
and gets no ratio). "runs" rows cut the file into windows of whole events (8 MB, cut at an event
boundary) and decode one window at a time, so memory stays bounded; "whole" rows decode the file
at once; ijson streams with its yajl2_c backend. `dsv4opt read_trace` is the reader as shipped
(decoding plus the typed tables). Benchmarks never assert: this prints figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
WINDOW = 8 << 20
MODES = ("dsv4opt-read_trace", "msgspec-runs-struct", "msgspec-runs-dict", "orjson-runs", "stdlib-runs",
         "stdlib-scan-per-event", "ijson-yajl2_c", "msgspec-whole", "orjson-whole", "stdlib-json.load")
_BOUNDARY = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")


def runs(path: Path):
    """Byte runs of whole events, comma-separated, from an uncompressed trace with traceEvents first."""
    with open(path, "rb") as f:
        buf = f.read(WINDOW)
        buf = buf[buf.index(b"[", buf.index(b'"traceEvents"')) + 1:]
        while True:
            more = f.read(WINDOW)
            if not more:
                yield buf[: buf.rindex(b"]")]
                return
            buf += more
            k = buf.rfind(b"}")
            while not _BOUNDARY.match(buf, k):
                k = buf.rfind(b"}", 0, k)
            yield buf[: k + 1]
            buf = buf[_BOUNDARY.match(buf, k).end() - 1:]


def decode(mode: str, path: Path) -> tuple[int, float]:
    """(events, GPU dur sum) the way `mode` reads the file."""
    durs: list[float] = []
    n = 0
    if mode == "dsv4opt-read_trace":
        from dsv4opt.trace import read_trace

        t = read_trace(path)
        return t.event_count, t.gpu_time_us
    if mode == "msgspec-runs-struct":
        from dsv4opt.trace.stream import Event
        import msgspec

        dec = msgspec.json.Decoder(list[Event])
        for run in runs(path):
            for e in dec.decode(b"[" + run + b"]"):
                n += 1
                if e.ph == "X" and e.cat in GPU_CATS:
                    durs.append(e.dur)
        return n, math.fsum(durs)
    if mode in ("msgspec-runs-dict", "orjson-runs", "stdlib-runs"):
        if mode == "msgspec-runs-dict":
            import msgspec

            loads = msgspec.json.Decoder().decode
        elif mode == "orjson-runs":
            import orjson

            loads = orjson.loads
        else:
            loads = json.loads
        for run in runs(path):
            for e in loads(b"[" + run + b"]"):
                n += 1
                if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
                    durs.append(e["dur"])
        return n, math.fsum(durs)
    if mode == "stdlib-scan-per-event":
        scan = json.JSONDecoder().scan_once
        skip = re.compile(r"[ \t\n\r]*,?[ \t\n\r]*").match
        for run in runs(path):
            text = run.decode()
            pos = 0
            while pos < len(text):
                e, pos = scan(text, skip(text, pos).end())
                pos = skip(text, pos).end()
                n += 1
                if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
                    durs.append(e["dur"])
        return n, math.fsum(durs)
    if mode == "ijson-yajl2_c":
        import ijson

        if ijson.backend != "yajl2_c":
            raise SystemExit(f"ijson backend is {ijson.backend}, not yajl2_c")
        with open(path, "rb") as f:
            for e in ijson.items(f, "traceEvents.item", use_float=True):
                n += 1
                if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
                    durs.append(e["dur"])
        return n, math.fsum(durs)
    if mode == "msgspec-whole":
        import msgspec

        events = msgspec.json.decode(path.read_bytes())["traceEvents"]
    elif mode == "orjson-whole":
        import orjson

        events = orjson.loads(path.read_bytes())["traceEvents"]
    else:
        with open(path, encoding="utf-8") as f:
            events = json.load(f)["traceEvents"]
    return len(events), math.fsum(e["dur"] for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS)


# Imported before the clock starts, so rows compare decoding, not import times.
IMPORTS = {"dsv4opt-read_trace": ("dsv4opt.trace",), "msgspec-runs-struct": ("msgspec", "dsv4opt.trace.stream"),
           "msgspec-runs-dict": ("msgspec",), "orjson-runs": ("orjson",), "ijson-yajl2_c": ("ijson",),
           "msgspec-whole": ("msgspec",), "orjson-whole": ("orjson",)}


def one(mode: str, path: Path) -> None:
    """Child process: decode and print one JSON line of figures."""
    import importlib

    for module in IMPORTS.get(mode, ()):
        importlib.import_module(module)
    # As in the reader: decoded events are acyclic, and the cyclic collector would only rescan them.
    gc.disable()
    t0, c0 = time.perf_counter(), time.process_time()
    n, total = decode(mode, path)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"events": n, "gpu_us": total, "wall_s": wall, "cpu_s": cpu, "peak_mb": peak_kb / 1024}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; the median is shown")
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args.one, args.traces[0])
        return 0
    for path in args.traces:
        print(f"\n{path} ({path.stat().st_size / 1e6:.1f} MB); decode time excludes interpreter start and imports")
        print(f"{'decoder':24} {'events':>9} {'wall s':>8} {'CPU s':>8} {'peak MB':>8}  check")
        reference = None
        for mode in MODES:
            rows = []
            for _ in range(args.repeat):
                out = subprocess.run([sys.executable, __file__, "--one", mode, str(path)], capture_output=True, text=True)
                if out.returncode != 0:
                    rows = [None]
                    print(f"{mode:24} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
                    break
                rows.append(json.loads(out.stdout))
            if rows == [None]:
                continue
            rows.sort(key=lambda r: r["wall_s"])
            med = rows[len(rows) // 2]
            reference = reference or (med["events"], med["gpu_us"])
            ok = (med["events"], med["gpu_us"]) == reference
            print(f"{mode:24} {med['events']:>9} {med['wall_s']:>8.2f} {sorted(r['cpu_s'] for r in rows)[len(rows) // 2]:>8.2f} "
                  f"{max(r['peak_mb'] for r in rows):>8.0f}  {'same events and GPU sum' if ok else 'MISMATCH'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
