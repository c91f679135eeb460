"""The campaign on the faithful baseline, read from committed profiles: each step's measured gain next
to the bound `dsv4opt recommend` (or, for fuse-glue, `dsv4opt glue`) predicted for it from the
profile before, as a Markdown table, and a chart of ms per step by category.

    python scripts/campaign.py [--chart docs/campaign_h200.png]

Nothing is typed in: every figure comes from the profiles named in STEPS.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsv4opt.analysis.categories import GLUE  # noqa: E402
from dsv4opt.analysis.profile import Profile  # noqa: E402
from dsv4opt.decision.glue_plan import glue_of, glue_outcome, glue_plan, require_glue  # noqa: E402
from dsv4opt.decision.recommend import candidates  # noqa: E402

MBG = "mma-attn+bf16-gemm+grouped-moe"
# (label, profile path with {c}, what was switched on in this step)
STEPS = [
    ("baseline", "evidence/h200/profiles/embedded-dsv4-flash-c{c}-ctx8192-baseline.json", None),
    ("+ grouped-moe", "evidence/h200/profiles/embedded-dsv4-flash-c{c}-ctx8192-grouped-moe.json", ("grouped-moe",)),
    ("+ mma-attn + bf16-gemm", f"evidence/h200/profiles/fuse-glue/embedded-dsv4-flash-c{{c}}-ctx8192-{MBG}.json",
     ("mma-attn", "bf16-gemm")),
    ("+ fuse-glue", f"evidence/h200/profiles/fuse-glue/embedded-dsv4-flash-c{{c}}-ctx8192-{MBG}+fuse-glue.json", ("fuse-glue",)),
]
# Alternatives to the last step, each against the same profile before it (BEFORE_LAST).
BEFORE_LAST = STEPS[-2][1]
ALTERNATIVES = [
    ("+ torch-compile (instead)", f"evidence/h200/profiles/fuse-glue/embedded-dsv4-flash-c{{c}}-ctx8192-{MBG}+torch-compile.json",
     ("torch-compile",)),
    ("+ fuse-glue + torch-compile", f"evidence/h200/profiles/fuse-glue/embedded-dsv4-flash-c{{c}}-ctx8192-{MBG}+fuse-glue+torch-compile.json",
     ("fuse-glue", "torch-compile")),
]
CHART_CATEGORIES = ("moe", "attention", "gemm", "communication", "glue")  # glue: the analysis' GLUE categories


@functools.cache  # the table, the glue outcomes and the chart read the same profiles
def load(path: str, c: int) -> Profile | None:
    p = ROOT / path.format(c=c)
    return Profile.load(p) if p.exists() else None


def bound(before: Profile, names: tuple[str, ...]) -> str:
    """The step gain predicted from `before` for switching on `names` (the largest single bound
    when several: recommend bounds one optimisation at a time)."""
    out = []
    by_name = {cand.name: cand for cand in candidates(before)}
    for n in names:
        if n == "fuse-glue" and glue_of(before) is not None:
            out.append((glue_plan(before).step_gain_bound, "glue"))
        elif n in by_name:
            out.append((by_name[n].amdahl_bound, "recommend"))
    if not out:
        return "-"
    gain, source = max(out)
    return f"{gain:.3g}x ({source}, {'+'.join(names)})" if len(names) > 1 else f"{gain:.3g}x ({source})"


def row(c: int, label: str, before: Profile | None, after: Profile, names) -> str:
    tps, ms = after.throughput["tokens_per_s"], after.throughput["ms_per_step"]
    launches = after.steps.get("launches_per_step")
    if before is None:
        return f"| {c} | {label} | {tps:.2f} | {ms:.1f} | {launches:.0f} | - | - | {after.meta.get('commit')} |"
    gain = tps / before.throughput["tokens_per_s"]
    return (f"| {c} | {label} | {tps:.2f} | {ms:.1f} | {launches:.0f} | {gain:.3f}x{mixed(before, after)} | "
            f"{bound(before, names)} | {after.meta.get('commit')} |")


MIXED_NOTE = ("* profiled at another commit than the profile before it: the gain also holds whatever else "
              "changed between the two commits.")


def mixed(before: Profile, after: Profile) -> str:
    return "*" if before.meta.get("commit") != after.meta.get("commit") else ""


def table(concurrencies=(1, 32, 64)) -> list[str]:
    lines = ["| C | step | tokens/s | ms/step | launches/step | measured gain | predicted bound (from) | commit |",
             "|---:|---|---:|---:|---:|---:|---|---|"]
    for c in concurrencies:
        prev = None
        skipped: tuple[str, ...] = ()
        for label, path, names in STEPS:
            p = load(path, c)
            if p is None:
                lines.append(f"| {c} | {label} | not measured | | | | | |")
                skipped += names or ()  # the next step is measured against the last profile there is
                continue
            names = skipped + (names or ()) if prev is not None else names
            shown = label if not skipped else f"{label} (with {' + '.join(skipped)})"
            lines.append(row(c, shown, prev, p, names))
            prev, skipped = p, ()
        for label, path, names in ALTERNATIVES:
            p = load(path, c)
            if p is not None:
                lines.append(row(c, label, load(BEFORE_LAST, c), p, names))
    return lines


def glue_outcomes(concurrencies=(1, 32, 64)) -> list[str]:
    """fuse-glue and torch-compile against the profile before them: the glue time per step removed
    against the saving `dsv4opt glue` predicted for the regions fuse-glue fuses."""
    lines = ["| C | switched on | launches/step | glue ms/step | saved ms/step | predicted for fuse-glue's regions | "
             "of prediction | step ms saved |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for c in concurrencies:
        before = load(BEFORE_LAST, c)
        if before is None or glue_of(before) is None:
            continue
        lines.append(f"| {c} | (before) | {before.steps['launches_per_step']:.0f} | "
                     f"{require_glue(before, 'profile').glue_us_per_step / 1e3:.2f} | | | | |")
        for label, path, _ in [STEPS[3]] + ALTERNATIVES:
            after = load(path, c)
            if after is None:
                continue
            o = glue_outcome(before, after)
            step_saved = before.throughput["ms_per_step"] - after.throughput["ms_per_step"]
            lines.append(f"| {c} | {label.removeprefix('+ ')} | {o.launches_per_step_after:.0f} | {o.glue_us_per_step_after / 1e3:.2f} | "
                         f"{o.measured_saving_us_per_step / 1e3:.2f} | {o.predicted_saving_us_per_step / 1e3:.2f} | "
                         f"{o.of_prediction:.1%}{mixed(before, after)} | {step_saved:.2f} |")
    return lines


def ms_by_category(p: Profile) -> dict[str, float]:
    """ms per step by chart category: the step's measured ms split by the categories' GPU-time shares."""
    total = sum(r.total_us for r in p.categories) or 1.0
    out = dict.fromkeys(CHART_CATEGORIES, 0.0)
    for r in p.categories:
        key = next((k for k in CHART_CATEGORIES if r.category.startswith(k)), "glue") if r.category not in GLUE else "glue"
        out[key] += r.total_us / total * p.throughput["ms_per_step"]
    return out


def chart(path: Path, concurrencies=(1, 32, 64)) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(concurrencies), figsize=(4.2 * len(concurrencies), 4.2))
    colours = dict(zip(CHART_CATEGORIES, ("#4c72b0", "#dd8452", "#55a868", "#8172b3", "#c44e52")))
    for ax, c in zip(axes, concurrencies):
        base = load(STEPS[0][1], c)
        # the baseline stays off the axis (40-140x taller): a linear scale keeps the stacks honest
        steps = [(label, load(p, c)) for label, p, _ in STEPS[1:] + ALTERNATIVES[:1]]
        if steps[0][1] is None:  # no grouped-moe-alone profile: the next bar took both steps at once
            steps[1] = ("+ grouped-moe\n+ mma-attn + bf16-gemm", steps[1][1])
        steps = [(label.replace(" (instead)", "\n(instead)").replace("+ ", "+"), p) for label, p in steps if p]
        bottoms = [0.0] * len(steps)
        split = [ms_by_category(p) for _, p in steps]
        for cat in CHART_CATEGORIES:
            vals = [ms[cat] for ms in split]
            ax.bar(range(len(steps)), vals, bottom=bottoms, color=colours[cat], label=cat)
            bottoms = [b + v for b, v in zip(bottoms, vals)]
        ax.set_xticks(range(len(steps)), [label for label, _ in steps], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("ms per step, split by GPU-time share")
        ax.set_title(f"C = {c} (baseline: {base.throughput['ms_per_step']:.0f} ms, "
                     f"{base.throughput['tokens_per_s']:.1f} tok/s)", fontsize=9)
        for i, (_, p) in enumerate(steps):
            ax.text(i, bottoms[i] * 1.01, f"{p.throughput['tokens_per_s']:.0f} tok/s", ha="center", va="bottom", fontsize=7)
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.suptitle("dsv4-flash decode on one H200 (one rank of EP8), context 8192: the campaign")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chart", type=Path, help="also draw the chart to this PNG")
    args = ap.parse_args()
    print("\n".join(table() + ["", MIXED_NOTE, ""] + glue_outcomes()))
    if args.chart:
        chart(args.chart)


if __name__ == "__main__":
    main()
