"""Diff two profiles: category shares side by side, kernels that moved most, and a verdict."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from dsv4opt.analysis.busy import timeline_summary
from dsv4opt.analysis.categories import CATEGORIES, category_label, members
from dsv4opt.analysis.profile import KernelRow, Profile
from dsv4opt.display import pct
from dsv4opt.errors import DsvOptError

MOVED_KERNELS = 10
# The old bottleneck must lose at least this fraction of its share to count as "moved".
MOVED_RELATIVE_DROP = 0.25


@dataclass
class Comparison:
    a_sources: list[str]
    b_sources: list[str]
    time_basis: str
    total_us: dict[str, float]  # what time_basis says: GPU time, or CPU self time
    categories: list[dict[str, Any]]
    moved: list[dict[str, Any]]
    top_kernel: dict[str, Any]
    top_category: dict[str, Any]
    throughput: dict[str, Any] | None
    verdict: str
    bottleneck_moved: bool
    notes: list[str] = field(default_factory=list)
    change: ThroughputChange | None = None  # ms/step before and after, against the measured noise
    steps: dict[str, int | None] = field(default_factory=dict)  # profiled steps the totals cover, a and b
    # Per-step means of the union of kernel intervals (not their sum) before and after: busy, idle
    # and stream overlap of the devices, and each category's exposed and overlapped time.
    timeline: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"schema": "dsv4opt.comparison/1", **asdict(self)}
        out["change"] = self.change.to_dict() if self.change else None
        # gpu_time_us: the name comparison/1 files have always carried total_us under
        return {**out, "gpu_time_us": self.total_us}

    def throughput_line(self) -> str | None:
        """tokens/s and ms/step before -> after with the verdict against the noise, each figure once."""
        if self.change is None:
            return None
        tps = (self.throughput or {}).get("tokens_per_s")
        head = f"tokens/s {tps['a']:.2f} -> {tps['b']:.2f}, " if tps and not self.change.on_tokens else ""
        return head + self.change.line()


# Settings two profiles must share to be compared: what was run, where, at what load, on which
# SGLang path and with which kernel in each part. Optimisations may differ (that is the point). Each
# entry is the setting's key in the profile's meta (or meta["settings"]) and what an embedded
# profile from before the setting existed ran with (None: a profile that lacks it is not checked on
# it). A dict-valued setting (which kernel ran each part) is compared part by part. A new setting is
# one entry here.
SETTINGS: dict[str, Any] = {
    "target": None, "device": None, "config": None, "layers": None, "kv": None, "concurrency": None,
    "context": None, "steps": None, "experts_resident": None, "ranks": None,
    "layout": "dp-ep",  # one dp-ep rank: the project's first premise
    "graph_context": 0,  # index rows sized to the contexts
    "sglang": "0.5.14",  # the SGLang decode path the embedded workload reproduces: sm_120's came first
    "sglang_version": None,  # the version of a profiled SGLang server
    "kernels": None,  # part -> which kernel ran it ("real SGLang kernel", "stand-in", ...)
}
SETTINGS_KEYS = tuple(SETTINGS)


def setting(p: Profile, key: str):
    """One run setting of a profile: its meta's, else its recorded settings', else what an embedded
    profile from before the setting existed ran with; None when unknown."""
    value = p.meta.get(key)
    recorded = p.meta.get("settings")
    if value is None and isinstance(recorded, dict):
        value = recorded.get(key)
    if value is None and p.meta.get("target") == "embedded":
        return _legacy_kernels(p) if key == "kernels" else SETTINGS.get(key)
    return value


def _legacy_kernels(p: Profile) -> dict | None:
    """What ran each part of a Hopper-path profile from before it was recorded: our stand-ins
    throughout, FlashMLA itself on a Hopper card (None for other paths: nothing to compare)."""
    if setting(p, "sglang") != "0.5.23":
        return None
    from dsv4opt.workload.production.choice import KernelChoice

    device = str(p.meta.get("device") or "")
    return KernelChoice(flashmla=any(card in device for card in ("H100", "H200", "H800", "H20"))).parts()


# The GPU family of the first SGLang path, for profiles from before it was recorded.
LEGACY_FAMILY = "sm_120"


def sglang_path(p: Profile) -> str | None:
    """The SGLang path a profile ran, for a label: "0.5.14 sm_120", "0.5.23 Hopper (sm_90)" (the embedded
    workload's), "0.5.23 server" (a profiled server), None for a trace that does not say."""
    if p.meta.get("target") == "sglang":
        version = p.meta.get("sglang_version")
        return f"{version} server" if version else None
    version = setting(p, "sglang")
    if version is None:
        return None
    family = p.meta.get("sglang_family") or (LEGACY_FAMILY if version == SETTINGS["sglang"] else None)
    return f"{version} {family}" if family else str(version)


def kernels_summary(p: Profile) -> str | None:
    """What ran the parts of a Hopper-path profile, in a phrase: "SGLang's kernels", "stand-in
    kernels", or which parts ran stand-ins; None where the profile does not record it."""
    kernels = setting(p, "kernels") or {}
    if not isinstance(kernels, dict) or not kernels:
        return None
    whole = [part for part, k in kernels.items() if str(k).startswith("stand-in")]
    partly = [part for part, k in kernels.items() if "stand-in" in str(k) and part not in whole]
    real = [part for part in kernels if part not in whole and part not in partly]
    partly_said = f"; partly in {', '.join(partly)}" if partly else ""
    if not whole and not partly:
        return "SGLang's kernels"
    if not real and not partly:
        return "stand-in kernels"
    if len(whole) + len(partly) > len(real):
        return f"stand-in kernels (SGLang's in {', '.join(real) or 'none whole'}{partly_said})"
    return f"SGLang's kernels (stand-ins in {', '.join(whole) or 'none whole'}{partly_said})"


def _differences(key: str, va, vb) -> list[str]:
    if isinstance(va, dict) and isinstance(vb, dict):
        return [f"{key}.{part}: {va.get(part, '-')} -> {vb.get(part, '-')}"
                for part in dict.fromkeys([*va, *vb]) if va.get(part) != vb.get(part)]
    return [f"{key}: {_shown(va)} -> {_shown(vb)}"] if va != vb else []


def _shown(value) -> str:
    return ", ".join(f"{k}: {v}" for k, v in value.items()) if isinstance(value, dict) else str(value)


def setting_differences(a: Profile, b: Profile) -> list[str]:
    """'key: a -> b' for each run setting the two profiles both record and differ in ('key.part: a
    -> b' for each part of a per-part setting)."""
    out = []
    for key in SETTINGS:
        va, vb = setting(a, key), setting(b, key)
        if va is not None and vb is not None:
            out += _differences(key, va, vb)
    return out


def require_comparable(a: Profile, b: Profile, force: bool = False) -> list[str]:
    """Refuse profiles run under different settings, naming each difference; with force, return
    the differences as warnings instead."""
    diffs = setting_differences(a, b)
    if diffs and not force:
        raise DsvOptError(
            "the profiles were run under different settings (" + "; ".join(diffs) + "): their tokens/s and "
            "shares do not compare; profile again at the same settings, or pass --force to compare anyway"
        )
    return diffs


def compare_profiles(a: Profile, b: Profile) -> Comparison:
    """Before (a) vs after (b)."""
    if a.time_basis != b.time_basis:
        raise DsvOptError(
            f"cannot compare a {a.time_basis!r} profile with a {b.time_basis!r} one; "
            "capture both with GPU activity (or both CPU-only)"
        )
    present = {c.category for c in a.categories} | {c.category for c in b.categories}
    categories = []
    for cat in CATEGORIES:
        if cat in present:
            sa, sb = a.category_share(cat), b.category_share(cat)
            categories.append({
                "category": cat, "share_a": sa, "share_b": sb, "delta": sb - sa,
                "total_us_a": a.category_total_us(cat), "total_us_b": b.category_total_us(cat),
            })
    ka = {k.name: k for k in a.kernels}
    kb = {k.name: k for k in b.kernels}
    moved = []
    for name in set(ka) | set(kb):
        ta = ka[name].total_us if name in ka else 0.0
        tb = kb[name].total_us if name in kb else 0.0
        row = ka.get(name) or kb[name]
        moved.append({
            "name": name, "short_name": row.display_name, "category": row.category,
            "total_us_a": ta, "total_us_b": tb, "delta_us": tb - ta,
            "share_a": ka[name].share if name in ka else 0.0, "share_b": kb[name].share if name in kb else 0.0,
        })
    moved.sort(key=lambda r: (-abs(r["delta_us"]), r["name"]))
    moved = moved[:MOVED_KERNELS]

    top_a, top_b = a.top_kernel, b.top_kernel
    tc_a, tc_b = a.top_category, b.top_category
    top_kernel = {"a": _brief(top_a), "b": _brief(top_b)}
    top_category = {"a": msgspec.to_builtins(tc_a), "b": msgspec.to_builtins(tc_b)}
    verdict, moved_flag = _verdict(a, b)
    return Comparison(
        a_sources=list(a.meta.get("sources", [])), b_sources=list(b.meta.get("sources", [])),
        time_basis=a.time_basis,
        total_us={"a": a.total_us, "b": b.total_us},
        categories=categories, moved=moved, top_kernel=top_kernel, top_category=top_category,
        throughput=_throughput(a, b), verdict=verdict, bottleneck_moved=moved_flag, timeline=_timeline(a, b),
        change=throughput_change(a, b), steps={"a": a.step_count, "b": b.step_count},
    )


def _brief(k: KernelRow | None) -> dict | None:
    if k is None:
        return None
    return {"name": k.name, "short_name": k.display_name, "category": k.category, "share": k.share,
            "total_us": k.total_us}


def _verdict(a: Profile, b: Profile) -> tuple[str, bool]:
    """What happened to the #1 category, and to the #1 kernel: a category's share is only ever
    printed under the category's name, a kernel's under the kernel's."""
    tc_a, tc_b = a.top_category, b.top_category
    if tc_a is None or tc_b is None:
        return "nothing to compare: one profile has no kernels", False
    cat = tc_a.category
    before, after = tc_a.share, b.category_share(cat)
    top_b = b.top_kernel
    top_kernel = f"#1 kernel {top_b.display_name} ({top_b.category_label}) {pct(top_b.share)}" if top_b else ""
    if tc_b.category != cat:
        return (f"bottleneck moved: {tc_a.label} {pct(before)} -> {pct(after)}; #1 category now {tc_b.label} "
                f"{pct(tc_b.share)}; {top_kernel}"), True
    if before > 0 and (before - after) / before >= MOVED_RELATIVE_DROP:
        return f"{tc_a.label} still #1 but down from {pct(before)} to {pct(after)}; {top_kernel}", True
    # Same #1 category, but the #1 kernel can still have been the bottleneck that moved (a single
    # hot kernel inside a category that is, summed over many small kernels, larger).
    ka = a.top_kernel
    if ka is not None and top_b is not None and ka.name != top_b.name:
        ka_after = sum(k.share for k in b.kernels if k.name == ka.name)
        if (ka.share - ka_after) / ka.share >= MOVED_RELATIVE_DROP:
            return (f"#1 kernel moved: {ka.display_name} ({ka.category_label}) "
                    f"{pct(ka.share)} -> {pct(ka_after)}; now {top_kernel}; #1 category still {tc_a.label} "
                    f"{pct(before)} -> {pct(after)}"), True
    return f"bottleneck did not move: {tc_a.label} {pct(before)} -> {pct(after)}", False


def _throughput(a: Profile, b: Profile) -> dict | None:
    out: dict[str, Any] = {}
    for key in ("tokens_per_s", "ms_per_step"):
        va = (a.throughput or {}).get(key)
        vb = (b.throughput or {}).get(key)
        if va and vb:
            out[key] = {"a": va, "b": vb, "ratio": vb / va}
    sa, sb = a.steps or {}, b.steps or {}
    if sa.get("gpu_us_per_step") and sb.get("gpu_us_per_step"):
        out["gpu_us_per_step"] = {"a": sa["gpu_us_per_step"], "b": sb["gpu_us_per_step"],
                                  "ratio": sb["gpu_us_per_step"] / sa["gpu_us_per_step"]}
    return out or None


def _timeline(a: Profile, b: Profile) -> dict | None:
    ta, tb = timeline_summary(a.timeline), timeline_summary(b.timeline)
    if ta is None or tb is None:
        return None
    out: dict[str, Any] = {"steps": {"a": ta.steps, "b": tb.steps}}
    for key in ("kernel_us", "span_us", "busy_us", "idle_us", "overlap_us"):
        va, vb = ta.device_total(key), tb.device_total(key)
        out[key] = {"a": va, "b": vb, "delta": vb - va}
    cats_a = {c.label: c for c in ta.categories}
    cats_b = {c.label: c for c in tb.categories}
    out["categories"] = [
        {"category": cat, **{f"{key}_{side}": getattr(c.get(cat), key, 0.0) if c.get(cat) else 0.0
                             for key in ("busy_us", "exposed_us", "overlapped_us") for side, c in (("a", cats_a), ("b", cats_b))}}
        for cat in CATEGORIES if cat in cats_a or cat in cats_b
    ]
    return out


@dataclass(frozen=True)
class TargetShift:
    """What an optimisation did to its target category between two profiles at the same settings."""

    category: str
    share_before: float
    share_after: float
    ms_per_step_before: float | None  # the category's GPU time per profiled step
    ms_per_step_after: float | None

    @property
    def shrank(self) -> bool:
        return self.share_after < self.share_before

    @property
    def time_saved(self) -> float | None:
        """Fraction of the target's time per step the optimisation removed."""
        if not self.ms_per_step_before:
            return None
        return 1.0 - (self.ms_per_step_after or 0.0) / self.ms_per_step_before

    def line(self) -> str:
        saved = self.time_saved
        saved_text = "" if saved is None else f", {saved:.0%} of its time per step removed"
        verdict = "shrank" if self.shrank else "did NOT shrink"
        return (f"targeted category {category_label(self.category)}: {self.share_before:.1%} -> {self.share_after:.1%} "
                f"({verdict}{saved_text})")


def target_shift(before: Profile, after: Profile, category: str) -> TargetShift:
    """`category` may be a target standing for several categories ("glue")."""
    wanted = members(category)

    def ms(p: Profile) -> float | None:
        steps = p.step_count
        return sum(p.category_total_us(c) for c in wanted) / steps / 1000 if steps else None

    def share(p: Profile) -> float:
        return sum(p.category_share(c) for c in wanted)

    return TargetShift(category, share(before), share(after), ms(before), ms(after))


# Without timed windows to measure the noise by, a change this small in ms/step is not called.
UNMEASURED_NOISE = 0.05


@dataclass(frozen=True)
class ThroughputChange:
    """ms/step before and after, and whether the change exceeds the measured run-to-run noise:
    the spread of the timed windows each profile took (`profile --repeat`).

    When the two steps decode different numbers of tokens (another concurrency or rank count,
    compared with --force), a longer step can still be more tokens/s: the change is then judged on
    tokens/s (tokens per step over each window's ms/step), and not at all when a profile records no
    tokens/s."""

    ms_before: float
    ms_after: float
    windows_before: tuple[float, ...]
    windows_after: tuple[float, ...]
    # tokens each step decodes, before and after: given only when they differ
    tokens_per_step: tuple[float | None, float | None] | None = None

    @property
    def on_tokens(self) -> bool:
        """Judged on tokens/s: the steps before and after carry different work."""
        return self.tokens_per_step is not None

    @property
    def judged(self) -> bool:
        return not self.on_tokens or None not in self.tokens_per_step

    def _rates(self, ms: float, windows: tuple[float, ...], tokens: float | None) -> tuple[float, tuple[float, ...]]:
        """Steps per ms, or tokens per s: a figure where more is faster, and its windows."""
        work = 1.0 if not self.on_tokens else 1000.0 * tokens
        return work / ms, tuple(work / w for w in windows)

    @property
    def speedup(self) -> float | None:
        """Throughput after over before: tokens/s across different work, else ms/step before over after."""
        if not self.judged:
            return None
        (a, _), (b, _) = self._both()
        return b / a

    def _both(self):
        tokens = self.tokens_per_step or (None, None)
        return (self._rates(self.ms_before, self.windows_before, tokens[0]),
                self._rates(self.ms_after, self.windows_after, tokens[1]))

    @property
    def noise_measured(self) -> bool:
        return len(self.windows_before) >= 2 and len(self.windows_after) >= 2

    @property
    def slower(self) -> bool:
        """Slower beyond the noise: every timed window after is slower than every window before."""
        if not self.judged:
            return False
        (a, wa), (b, wb) = self._both()
        if self.noise_measured:
            return max(wb) < min(wa)
        return b < a / (1 + UNMEASURED_NOISE)

    @property
    def faster(self) -> bool:
        if not self.judged:
            return False
        (a, wa), (b, wb) = self._both()
        if self.noise_measured:
            return min(wb) > max(wa)
        return b > a / (1 - UNMEASURED_NOISE)

    @property
    def verdict(self) -> str:
        """"faster", "slower", "within noise" (inside the measured spread), "not called" (a
        change under UNMEASURED_NOISE where the spread is unknown), or "not judged" (different work
        per step and no tokens/s to judge by)."""
        if not self.judged:
            return "not judged"
        if self.faster:
            return "faster"
        if self.slower:
            return "slower"
        return "within noise" if self.noise_measured else "not called"

    def spread(self) -> str:
        """The noise the verdict was judged against, in words."""
        if self.noise_measured:
            return (f"timed windows {_range(self.windows_before)} -> {_range(self.windows_after)} ms/step, "
                    f"{len(self.windows_before)} and {len(self.windows_after)} windows")
        return f"spread unknown: {self._timed_once()}"

    def _timed_once(self) -> str:
        once = " and ".join(w for w, n in (("before", self.windows_before), ("after", self.windows_after)) if len(n) < 2)
        return f"{once} timed once; `profile --repeat` measures it"

    def line(self) -> str:
        """"ms/step A -> B: 1.02x, within noise (the spread)"; across different work per step,
        "tokens/s A -> B: 1.20x, faster (...)" or no verdict."""
        ms = f"ms/step {self.ms_before:.2f} -> {self.ms_after:.2f}"
        if not self.judged:
            return (f"{ms}: no verdict: the steps decode different numbers of tokens and a profile records no "
                    "tokens/s to judge by")
        if self.on_tokens:
            (a, _), (b, _) = self._both()
            head = f"tokens/s {a:.2f} -> {b:.2f}: {self.speedup:.2f}x"
            before, after = self.tokens_per_step
            basis = (f"judged on tokens/s: a step decodes {_tokens(before)} before, {_tokens(after)} after, "
                     f"so {ms} is no speed; ")
        else:
            head, basis = f"{ms}: {self.speedup:.2f}x", ""
        if self.verdict == "not called":
            return (f"{head}, not called: under {UNMEASURED_NOISE:.0%} while the spread is unknown "
                    f"({basis}{self._timed_once()})")
        shown = "SLOWER" if self.verdict == "slower" else self.verdict
        beyond = "" if self.noise_measured else f"beyond {UNMEASURED_NOISE:.0%}; "
        return f"{head}, {shown} ({basis}{beyond}{self.spread()})"

    def to_dict(self) -> dict[str, Any]:
        return {"ms_before": self.ms_before, "ms_after": self.ms_after, "windows_before": list(self.windows_before),
                "windows_after": list(self.windows_after), "speedup": self.speedup, "verdict": self.verdict,
                "noise_measured": self.noise_measured,
                "basis": "tokens/s" if self.on_tokens else "ms/step",
                "tokens_per_step": list(self.tokens_per_step) if self.tokens_per_step else None}


def _tokens(n: float) -> str:
    return f"{n:g} token" + ("" if n == 1 else "s")


def _range(windows: tuple[float, ...]) -> str:
    return f"{min(windows):.2f}-{max(windows):.2f}"


# Settings that change how many tokens one step decodes (a layout: whether each rank decodes its own
# C requests or all ranks decode the same C).
WORK_KEYS = ("concurrency", "ranks", "layout")


def throughput_change(before: Profile, after: Profile) -> ThroughputChange | None:
    tb, ta = before.throughput or {}, after.throughput or {}
    if not tb.get("ms_per_step") or not ta.get("ms_per_step"):
        return None
    tokens = None
    if any(setting(before, k) is not None and setting(after, k) is not None and setting(before, k) != setting(after, k)
           for k in WORK_KEYS):
        tokens = (_tokens_per_step(tb), _tokens_per_step(ta))
        if None not in tokens and math.isclose(*tokens, rel_tol=1e-6):
            tokens = None  # another layout or rank count, the same tokens a step: ms/step still says it
    return ThroughputChange(tb["ms_per_step"], ta["ms_per_step"], tuple(tb.get("ms_per_step_windows") or ()),
                            tuple(ta.get("ms_per_step_windows") or ()), tokens)


def _tokens_per_step(throughput: dict) -> float | None:
    """Tokens one step decodes, from the tokens/s and ms/step the capture measured together."""
    tps, ms = throughput.get("tokens_per_s"), throughput.get("ms_per_step")
    return round(tps * ms / 1000.0, 6) if tps and ms else None
