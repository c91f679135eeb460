#!/usr/bin/env python3
"""Does `dsv4opt analyze` print and write the same as it did? For speed work on the analysis path.

    python benchmarks/check_analyze_same.py save /tmp/analyze-before     # on the commit before
    python benchmarks/check_analyze_same.py compare /tmp/analyze-before  # after the change

Runs `python -m dsv4opt analyze TRACE --json OUT` (a fresh process each, COLUMNS 80 and 120) on the
real traces of ../shared/traces and tests/data, a graph replay with its eager reference as
--capture, and any big traces passed with --extra (benchmarks/make_big_trace.py), and keeps the
tables printed and the profile written (its `date` dropped: the only field meant to change). `compare`
reruns them and prints each case that differs, with the first differing line. It never asserts.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
DATA = REPO / "tests" / "data"


def cases(extra: list[Path]) -> dict[str, list[str]]:
    """name -> analyze's arguments before --json."""
    out = {}
    for trace in sorted(SHARED.glob("*.json.gz")) + sorted(DATA.glob("*.trace.json.gz")) + extra:
        out[trace.name] = [str(trace)]
    replay = DATA / "h200-dsv4flash-l3-c4-graph.trace.json.gz"
    out["replay-with-capture"] = [str(replay), "--capture", str(DATA / "h200-dsv4flash-l3-c4-eager.trace.json.gz")]
    out["top-5-wide"] = [str(DATA / "h200-dsv4flash-faithful-l4-c32-eager.trace.json.gz"), "--top", "5", "--wide"]
    return out


def run(args: list[str], columns: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.json"
        env = dict(os.environ, COLUMNS=str(columns), PYTHONPATH=str(REPO))
        done = subprocess.run([sys.executable, "-m", "dsv4opt", "analyze", *args, "--json", str(out)],
                              capture_output=True, text=True, env=env, cwd=REPO)
        profile = json.loads(out.read_text()) if out.exists() else None
    if profile is not None:
        profile.get("meta", {}).pop("date", None)
    return {"rc": done.returncode, "stdout": done.stdout.replace(str(out), "OUT"), "stderr": done.stderr,
            "profile": profile}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("save", "compare"))
    ap.add_argument("folder", type=Path)
    ap.add_argument("--extra", type=Path, nargs="*", default=[], help="more traces (e.g. the 55 MB benchmark trace)")
    args = ap.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    same = differ = 0
    for name, argv in cases(args.extra).items():
        for columns in (80, 120):
            got = run(argv, columns)
            path = args.folder / f"{name}.{columns}.json"
            if args.mode == "save":
                path.write_text(json.dumps(got, indent=1, sort_keys=True))
                print(f"saved {path.name} (rc {got['rc']})")
                continue
            want = json.loads(path.read_text())
            if want == json.loads(json.dumps(got)):
                same += 1
                continue
            differ += 1
            a = json.dumps(want, indent=1, sort_keys=True).splitlines()
            b = json.dumps(got, indent=1, sort_keys=True).splitlines()
            first = next((d for d in difflib.unified_diff(a, b, lineterm="", n=0) if d[:1] in "+-" and d[:3] not in ("---", "+++")), "?")
            print(f"DIFFERS {name} at {columns} columns: {first}")
    if args.mode == "compare":
        print(f"{same} cases the same, {differ} differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
