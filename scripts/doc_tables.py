"""The tables of README.md and docs/results.md, printed from the committed H200 profiles
(evidence/h200/profiles/) by the functions `dsv4opt compare` and the table scripts use, so a figure in
the docs cannot disagree with what the tool says of the same profiles.

Each table sits in its document between `<!-- results:NAME -->` and `<!-- /results:NAME -->`.

    python scripts/doc_tables.py            # rewrite every table between its markers
    python scripts/doc_tables.py --check    # change nothing; exit 1 naming each table that differs
    python scripts/doc_tables.py --show NAME

tests/test_doc_tables.py runs the check on the CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dsv4opt.analysis.categories import category_label  # noqa: E402
from dsv4opt.analysis.compare import ThroughputChange, compare_profiles, throughput_change  # noqa: E402
from dsv4opt.analysis.profile import Profile  # noqa: E402
from dsv4opt.display import pct  # noqa: E402
from scripts import campaign, path_table, results_table  # noqa: E402

PROFILES = ROOT / "evidence" / "h200" / "profiles"
HOPPER = PROFILES / "hopper-0.5.23"
CAMPAIGN = PROFILES / "layouts" / "campaign"  # its top level only: c32-previous-kernel/ is the cut run
HOPPER_LOOPS = ROOT / "evidence" / "h200" / "hopper"  # user_loop.py's summary.json per C: recommend's bounds
DOCUMENTS = ("README.md", "docs/results.md")


@dataclass
class Step:
    name: str
    before: Profile
    after: Profile
    change: ThroughputChange
    kept: bool


def _profiles(folder: Path, c: int) -> list[Profile]:
    """One loop's profiles at concurrency c, in the order they were taken."""
    found = [Profile.load(p) for p in folder.glob(f"*-c{c}-*.json")]
    return sorted(found, key=lambda p: p.meta["date"])


def loop_steps(folder: Path, c: int) -> tuple[Profile, list[Step]]:
    """Replays a loop from its profiles: each profile adds one optimisation to what is on, and is
    kept unless its re-profile is slower beyond the noise (`ThroughputChange.slower`, the rule
    `dsv4opt apply` keeps or leaves an optimisation off by)."""
    profiles = _profiles(folder, c)
    base = next(p for p in profiles if not p.meta.get("optimizations"))
    current, steps = base, []
    for p in profiles:
        added = set(p.meta.get("optimizations") or []) - set(current.meta.get("optimizations") or [])
        if p is base or len(added) != 1:
            continue
        change = throughput_change(current, p)
        kept = change is not None and not change.slower
        steps.append(Step(added.pop(), current, p, change, kept))
        if kept:
            current = p
    return base, steps


def _top_category_after(before: Profile, after: Profile) -> str:
    """The #1 category `dsv4opt compare BEFORE AFTER` names for the profile after."""
    top = compare_profiles(before, after).top_category["b"]
    return f"{category_label(top['category'])} {pct(top['share'])}"


def loop_summary(folder: Path, concurrencies: tuple[int, ...], digits: int) -> list[str]:
    """README: per C, the loop's baseline, what it applied and kept, and where it ended."""
    out = ["| C | baseline tokens/s | what the loop applied, in its order | tokens/s | x baseline | top category after |",
           "| ---: | ---: | --- | ---: | ---: | --- |"]
    for c in concurrencies:
        base, steps = loop_steps(folder, c)
        words, final = [], base
        for s in steps:
            if not s.kept:
                words.append(f"({s.name} {s.change.speedup:.2f}x, left off)")
                continue
            words.append(s.name + (" (within noise)" if s.change.verdict == "within noise" else ""))
            final = s.after
        gain = compare_profiles(base, final).change.speedup
        out.append(f"| {c} | {base.throughput['tokens_per_s']:.2f} | {', '.join(words).replace(', (', ' (')} | "
                   f"{final.throughput['tokens_per_s']:.2f} | {gain:.{digits}f}x | {_top_category_after(base, final)} |")
    return out


def hopper_loop(concurrencies: tuple[int, ...] = (1, 32, 64)) -> list[str]:
    """docs/results.md: each apply of the Hopper loop, recommend's bound then (the run's summary.json)
    and what the profiles measured."""
    out = ["| C | applied | bound | measured | tokens/s | kept |", "|---:|---|---:|---:|---:|---|"]
    for c in concurrencies:
        summary = json.loads((HOPPER_LOOPS / f"c{c}" / "summary.json").read_text())
        bounds = {s["apply"]: s["bound"] for s in summary["steps"] if "apply" in s}
        for s in loop_steps(HOPPER, c)[1]:
            noise = " (within noise)" if s.change.verdict == "within noise" else ""
            kept = f"yes{noise}" if s.kept else "no: slower beyond the noise"
            out.append(f"| {c} | {s.name} | {bounds[s.name]:.2f}x | {s.change.speedup:.3f}x{noise} | "
                       f"{s.before.throughput['tokens_per_s']:.2f} -> {s.after.throughput['tokens_per_s']:.2f} | {kept} |")
    return out


def _paths(pattern: str) -> list[str]:
    return [str(p) for p in sorted(PROFILES.glob(pattern))]


TABLES: dict[str, Callable[[], list[str]]] = {
    "readme-hopper": lambda: loop_summary(HOPPER, (1, 32, 64), digits=3),
    "readme-campaign": lambda: loop_summary(CAMPAIGN, (1, 32, 64), digits=1),
    "hopper-path": lambda: path_table.lines(_paths("hopper-0.5.23/*.json")),
    "hopper-loop": hopper_loop,
    "layouts": lambda: results_table.lines(_paths("layouts/*.json")),
    "campaign-steps": lambda: campaign.table() + ["", campaign.MIXED_NOTE],
    "campaign-glue": campaign.glue_outcomes,
    "faithful": lambda: results_table.lines(_paths("embedded-*.json")),
}

BLOCK = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


def blocks(text: str) -> dict[str, str]:
    """NAME -> the text between its markers."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def render(name: str) -> str:
    return "\n".join(TABLES[name]()) + "\n"


def rewrite(text: str, rendered: dict[str, str]) -> str:
    """text with each block whose name is in `rendered` replaced by it."""
    return BLOCK.sub(lambda m: m[1] + rendered.get(m["name"], m["body"]) + m[4], text)


def drift(root: Path = ROOT) -> list[str]:
    """'FILE: NAME' for each table whose committed text is not what its function prints now, and
    'FILE: NAME unknown' for markers naming no table."""
    out, cache = [], {}
    for doc in DOCUMENTS:
        for name, body in blocks((root / doc).read_text()).items():
            if name not in TABLES:
                out.append(f"{doc}: {name} unknown")
                continue
            cache.setdefault(name, render(name))
            if body != cache[name]:
                out.append(f"{doc}: {name}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
    ap.add_argument("--show", metavar="NAME", choices=sorted(TABLES), help="print one table")
    a = ap.parse_args()
    if a.show:
        print(render(a.show), end="")
        return 0
    if a.check:
        stale = drift()
        for line in stale:
            print(f"differs from the profiles: {line} (python scripts/doc_tables.py rewrites it)")
        return 1 if stale else 0
    for doc in DOCUMENTS:
        path = ROOT / doc
        text = path.read_text()
        new = rewrite(text, {n: render(n) for n in blocks(text) if n in TABLES})
        if new != text:
            path.write_text(new)
            print(f"rewrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
