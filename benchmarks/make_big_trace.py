#!/usr/bin/env python3
"""Build a large chrome trace by repeating a real trace's steps, for reader speed/memory benchmarks.

Each copy of the source's events is shifted in time past the previous copy, and every id that links
events (correlation, External id, flow id, Python ids) is offset, so the copies stay distinct steps
(ProfilerStep#N is renumbered too). The output is plain JSON (not gzip), written event by event.

    python benchmarks/make_big_trace.py ../shared/traces/tracelens_h100_qwen1.5_0.5b.json.gz /tmp/big.json --mb 250

Do not commit the output.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

ID_ARGS = ("correlation", "External id", "Python id", "Python parent id", "Ev Idx", "Fwd thread id")
STEP = re.compile(r"^ProfilerStep#(\d+)$")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--mb", type=float, default=250.0, help="stop once the output reaches this many MB")
    args = ap.parse_args()
    if args.out.exists():
        print(f"{args.out}: already exists; remove it first", file=sys.stderr)
        return 1
    opener = gzip.open if args.source.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(args.source, "rt", encoding="utf-8") as f:
        data = json.load(f)
    events = data.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    shift = (end - start) + 1000.0
    id_stride = 1 + max([e.get("args", {}).get(k, 0) for e in events for k in ID_ARGS
                         if isinstance(e.get("args", {}).get(k), int)] + [e["id"] for e in events if isinstance(e.get("id"), int)] + [0])
    steps = [int(m.group(1)) for e in events if (m := STEP.match(str(e.get("name", ""))))]
    step_stride = (max(steps) - min(steps) + 1) if steps else 1
    limit = int(args.mb * 1e6)
    written = 0
    copies = 0
    with open(args.out, "w", encoding="utf-8") as out:
        head = json.dumps(data)[:-1]
        out.write(head + (", " if data else "") + '"traceEvents": [\n')
        written += len(head)
        first = True
        while written < limit:
            for e in events:
                if copies and e.get("ph") == "M":
                    continue
                e = _shifted(e, copies, shift, id_stride, step_stride)
                line = ("" if first else ",\n") + json.dumps(e)
                out.write(line)
                written += len(line)
                first = False
            copies += 1
        out.write("\n]}\n")
    print(f"{args.out}: {written / 1e6:.0f} MB, {copies} copies of {args.source.name}")
    return 0


def _shifted(e: dict, i: int, shift: float, id_stride: int, step_stride: int) -> dict:
    if i == 0:
        return e
    e = dict(e)
    if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M":
        e["ts"] = e["ts"] + i * shift
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + i * id_stride
    a = e.get("args")
    if isinstance(a, dict):
        a = dict(a)
        for k in ID_ARGS:
            if isinstance(a.get(k), int) and a[k] > 0:
                a[k] = a[k] + i * id_stride
        e["args"] = a
    m = STEP.match(str(e.get("name", "")))
    if m:
        e["name"] = f"ProfilerStep#{int(m.group(1)) + i * step_stride}"
    return e


if __name__ == "__main__":
    sys.exit(main())
