"""Rank the changes that could speed a profile up, and pick one, from data.

Each candidate gets a share of GPU time, an Amdahl bound on the step speed-up, the fragmentation of
its target category, and its risk. The share is of what its slots replace: on an embedded profile
whose parts account for the time, the parts its slots run in (the bound as if they took no time: the
slot removes the glue filed under other categories with its kernels); elsewhere its target category
(with its measured kernel speed-up when one is on record) or, for glue, the regions it fuses. Optimisations the tool can apply behind a
correctness gate are preferred over generic levers (fp8 weights) unless
they promise too little: a lever is advice, its bound is an upper limit nobody has measured here.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from importlib import resources

import msgspec

from dsv4opt.analysis.categories import GEMM_TC, GLUE_TARGET, category_label, members
from dsv4opt.analysis.parts import COMPILED_GLUE, NO_PART, UNMATCHED_REPLAY
from dsv4opt.analysis.profile import GlueRegionRow, KernelRow, Profile
from dsv4opt.decision.fragmentation import Fragmentation, fragmentation
from dsv4opt.decision.glue_plan import GluePlan, glue_of, glue_plan
from dsv4opt.optimizations.registry import OPTIMIZATIONS, Optimization

GLUE_SECTION = 5  # regions the recommendation shows

MIN_SHARE = 0.02  # below this a target is noise, not a bottleneck
# Below this, what an optimisation replaces is not in the profile: the parts its slots run in hold
# other kernels, so the parts' share would bound something it does not do.
MIN_TARGET = 0.002
MIN_GAIN = 1.05  # an applicable optimisation must promise at least this to beat a lever
MAX_OUTSIDE = 0.02  # above this share of GPU time outside any part, the parts cannot bound a slot


@dataclass
class Candidate:
    name: str
    kind: str  # "optimisation": dsv4opt can apply it; "lever": advice, no switch in dsv4opt
    target: str  # a category, or "glue"
    share: float
    share_of: str  # what `share` is of: "parts indexer, mhc_pre", the category's label, or the glue it fuses
    amdahl_bound: float  # upper bound on the whole step's speed-up
    kernel_speedup: float | None  # measured speed-up of the target's kernels, when on record
    speedup_source: str
    fragmentation: Fragmentation
    risk: str
    changes_selection: bool
    needs_graph: bool
    enabled: bool = False
    notes: list[str] = field(default_factory=list)
    fits: bool | None = True  # applies to this profile (None: cannot be told: which model, or which glue it fuses)
    why_not: str | None = None  # when it does not fit: why, in a phrase ("already upstream in SGLang 0.5.23 (...)")
    measured_on: str | None = None  # the SGLang path its kernel_speedup was timed on ("0.5.14 sm_120")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Recommendation:
    candidates: list[Candidate]
    chosen: Candidate | None
    explanation: list[str]
    glue_regions: list[GlueRegionRow] = field(default_factory=list)  # the profile's top regions by saving
    glue_plans: list[GluePlan] = field(default_factory=list)  # what each optimisation of glue fuses of them

    @property
    def ranked(self) -> list[Candidate]:
        """The candidates a table ranks: those that apply here (and those already on)."""
        return [c for c in self.candidates if c.fits is True or c.enabled]

    @property
    def not_applicable(self) -> list[Candidate]:
        """Candidates that cannot apply here, each with why_not: listed after the table, never ranked."""
        return [c for c in self.candidates if c.fits is False and not c.enabled]

    def to_dict(self) -> dict:
        return {
            "chosen": self.chosen.name if self.chosen else None,
            "explanation": self.explanation,
            "not_applicable": [{"name": c.name, "because": c.why_not} for c in self.not_applicable],
            "candidates": [c.to_dict() for c in self.candidates],
            "glue_regions": msgspec.to_builtins(self.glue_regions),
            "glue_plans": [p.to_dict() for p in self.glue_plans],
        }


def amdahl(share: float, kernel_speedup: float | None) -> float:
    """Step speed-up when a `share` of the time runs `kernel_speedup` times faster (None: infinitely)."""
    rest = 1.0 - share
    if kernel_speedup is None or kernel_speedup <= 0:
        return float("inf") if rest <= 0 else 1.0 / rest
    return 1.0 / (rest + share / kernel_speedup)


# The SGLang path measured.json's top-level figures were timed against (version, GPU family); other
# paths' figures sit under its "on_paths", keyed the same way.
RECORDED_ON = "0.5.14 sm_120"


def measured_kernel_speedup(opt: Optimization, concurrency: int | None,
                            on: str | None = None) -> tuple[float | None, str]:
    """The optimisation's kernel speed-up from its committed benchmark record, nearest concurrency,
    against the kernel it replaces on SGLang path `on` ("0.5.23 sm_90"; None: the record's own path).
    A path with no figure of its own gets none: another path's figure is timed against another kernel."""
    try:
        text = resources.files(opt.module).joinpath("measured.json").read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError, OSError):
        return None, "no measurement on record: bound assumes the target takes no time"
    record = json.loads(text)
    if on is not None and on != RECORDED_ON:
        record = (record.get("on_paths") or {}).get(on)
        if record is None:
            return None, f"not measured on this path (SGLang {on}): bound assumes the target takes no time"
    table = {int(c): float(v) for c, v in record.get("kernel_speedup", {}).items()}
    if not table:
        return None, "no measurement on record: bound assumes the target takes no time"
    c = min(table, key=lambda x: abs(x - concurrency)) if concurrency else max(table)
    against = f" against {record['against']}" if record.get("against") else ""
    return table[c], (f"measured {table[c]:.{1 if table[c] >= 10 else 2}f}x{against} (B={c}, "
                      f"{record.get('device', '?')}; {record.get('source', '')})")


def path_key(profile: Profile) -> str | None:
    """"0.5.23 sm_90": the SGLang version and GPU family a profile ran, as measured.json keys its
    figures; None where the profile does not say (a third-party trace)."""
    meta = profile.meta
    if meta.get("target") == "embedded":
        from dsv4opt.workload.paths import DEFAULT_PATH, PATHS

        path = PATHS.get(str(meta.get("sglang", DEFAULT_PATH)))
        return f"{path.name} {path.family_code}" if path else None
    if meta.get("target") == "sglang" and meta.get("sglang_version"):
        from dsv4opt.optimizations import sglang_versions as V

        family = V.family_of_device(meta.get("device")) or V.family_of_kernels(k.name for k in profile.kernels)
        return f"{meta['sglang_version']} {family}" if family else None
    return None


def profile_model(profile: Profile) -> str | None:
    """The model family a profile was taken of, when it says: "deepseek-v4", another name, or None."""
    meta = profile.meta
    if meta.get("target") == "embedded" and str(meta.get("config", "")).startswith("dsv4"):
        return "deepseek-v4"
    name = str(meta.get("model") or meta.get("model_path") or "")
    if not name:
        return None
    key = name.lower().replace("_", "-")
    return "deepseek-v4" if ("deepseek-v4" in key or "dsv4" in key) else key


def candidates(profile: Profile, enabled: list[str] | None = None) -> list[Candidate]:
    enabled = set(profile.meta.get("optimizations") or []) | set(enabled or [])
    concurrency = profile.meta.get("concurrency")
    out: list[Candidate] = []
    model = profile_model(profile)
    on = path_key(profile)
    for opt in OPTIMIZATIONS.values():
        frag = fragmentation(profile, members(opt.target_category))
        if frag.share <= 0 and opt.name not in enabled:
            continue
        if _does_not_fit(profile, opt, model, enabled):
            continue
        notes = [] if model else [f"it is written for {opt.model} and this profile does not say which model it is"]
        speedup, source = measured_kernel_speedup(opt, concurrency, on) if profile.time_basis == "gpu" else (
            None, "no CPU measurement on record: bound assumes the target takes no time")
        measured_on = (on or RECORDED_ON) if speedup is not None else None
        measured = speedup is not None  # on record for this path, whether or not the rule below uses it
        share, fits, share_of = frag.share, True if model else None, category_label(opt.target_category)
        why_not = None
        in_parts = replaced_share(profile, opt)
        if opt.target_category == GLUE_TARGET:
            share, note, known = _glue_share(profile, opt, frag)
            if opt.fuses_all_glue:
                share_of = "eager glue" if profile.meta.get("target") == "embedded" else "all glue"
            else:
                share_of = "glue it fuses" if known else "all glue"
            if known:
                notes.append(note)
            else:  # what it fuses cannot be told (None), or none of the regions is its code (False): never chosen
                notes.insert(0, note)
                fits = False if known is False else None
                why_not = note if known is False else None
            if speedup is None:
                source = "no measurement on record: bound assumes the regions it fuses take no time"
        elif in_parts is not None:
            share, share_of = in_parts, "parts " + ", ".join(opt.parts)
            if on in (None, RECORDED_ON):
                # the figure on record times the kernels alone; the slot removes its part's glue with them
                source = (f"bound assumes the parts it replaces take no time"
                          + (f"; its kernels' {speedup:.1f}x on record leaves out the glue it removes with them"
                             if speedup is not None else ""))
                speedup = measured_on = None
            elif speedup is None:
                source = f"not measured on this path (SGLang {on}): bound assumes the parts it replaces take no time"
            if frag.share < MIN_TARGET and opt.name not in enabled:
                fits, why_not = False, (f"what it replaces, {category_label(opt.target_category)}, is {frag.share:.1%} of "
                                        f"{profile.time_label} here (its parts hold other kernels)")
        if opt.needs_measurement and not measured and opt.name not in enabled:
            # never ranked on a bound alone, nor ruled out by its target category's share (which is
            # not all it replaces): said under the table, as one whose fit cannot be told
            fits, why_not = None, None
            notes.insert(0, f"no speed-up of it is measured on this SGLang path yet (`dsv4opt bench {opt.name}` "
                            "on a GPU measures it)")
        out.append(
            Candidate(
                name=opt.name, kind="optimisation", target=opt.target_category, share=share, share_of=share_of,
                amdahl_bound=amdahl(share, speedup), kernel_speedup=speedup, speedup_source=source,
                fragmentation=frag, risk=opt.risk, changes_selection=opt.changes_selection,
                needs_graph=opt.needs_graph, enabled=opt.name in enabled, notes=notes, fits=fits, why_not=why_not,
                measured_on=measured_on,
            )
        )
    out += _levers(profile)
    return sorted(out, key=lambda c: (c.enabled, -c.amdahl_bound))


def replaced_share(profile: Profile, opt: Optimization) -> float | None:
    """The share of GPU time in the parts `opt`'s slots run in, or None where the parts cannot tell:
    not an embedded profile (SGLang's and other traces name no parts of this workload), no parts, or
    MAX_OUTSIDE or more of the time outside any (a compiled step: torch.compile's graphs hide them)."""
    if not opt.parts or not profile.parts or profile.meta.get("target") != "embedded" or profile.time_basis != "gpu":
        return None
    outside = sum(p.share for p in profile.parts if p.part in (NO_PART, UNMATCHED_REPLAY, COMPILED_GLUE))
    if outside >= MAX_OUTSIDE:
        return None
    return sum(p.share for p in profile.parts if p.part in opt.parts)


def _glue_share(profile: Profile, opt: Optimization, frag: Fragmentation) -> tuple[float, str, bool | None]:
    """The share an optimisation of glue slots targets: the regions it fuses, when the profile's
    regions say which (known: True); else all of the glue, an upper limit nobody can vouch for (None:
    what it fuses cannot be told; False: the regions say none is its code)."""
    if opt.fuses_all_glue:
        if profile.meta.get("target") == "embedded":
            eager = eager_glue_share(profile)
            return eager, (f"works on the glue eager torch launches: bound by that ({eager:.1%}); the workload's own "
                           f"Triton glue kernels ({frag.share - eager:.1%}) stay opaque under it"), True
        return frag.share, "works on every glue region: bound by all of the glue", True
    if glue_of(profile) is None:
        return frag.share, ("the profile holds no glue regions, so what it fuses cannot be told (`dsv4opt glue` on "
                            "the profile says how to record them)"), None
    plan = glue_plan(profile, opt.name)
    if not plan.regions:
        why = plan.notes[0] if plan.notes else "no region of the profile is one it fuses"
        # regions keyed by source sites that name none of its code: it has nothing to fuse here
        none_of_its_code = glue_of(profile).keyed_by == "source sites" and not plan.already_on
        return frag.share, why, False if none_of_its_code else None
    return plan.share, (f"fuses {len(plan.regions)} glue regions, {plan.share:.2%} of GPU time: "
                        f"{plan.launches_saved_per_step:.0f} launches/step fewer, predicted to save "
                        f"{plan.saving_us_per_step:.1f} µs/step"), True


# The embedded workload's own Triton kernels (`_name_kernel`), which torch-compile keeps opaque: its
# custom ops (optimizations/torch_compile/ops.py). Inductor's own are `triton_*`, ATen's C++ names.
_OWN_TRITON = re.compile(r"^_\w+_kernel$")


def eager_glue_share(profile: Profile) -> float:
    """The share of glue kernels an embedded profile's eager torch launched (not the workload's Triton)."""
    if profile.total_us <= 0:
        return 0.0
    glue = members(GLUE_TARGET)
    eager = sum(k.total_us for k in profile.kernels if k.category in glue and not _OWN_TRITON.match(k.name))
    return eager / profile.total_us


# Tensor-core GEMMs fp8 weights cannot halve, by name: weights already in 8 bits or fewer (block FP8,
# cuBLAS's FP8 `nvjet_*_qq*` from aten::_scaled_mm, FBGEMM's f8f8bf16, CUTLASS e4m3/e2m1 templates, int8,
# MXFP4/NVFP4, the W4A16 kernels of Marlin, Machete, AWQ, GPTQ and TensorRT-LLM's fpA_intB), and the
# indexer's q x K over the key cache (the embedded workload's two kernels for it), which reads no weights.
_NOT_WIDE_WEIGHTS = re.compile(r"fp8|f8f8|e4m3|e5m2|e2m1|w8a8|i8i8|int8|fp4|mxf|marlin|wna16|machete|awq|gptq|fpA_intB|"
                               r"^nvjet_\w*?_qq|^_indexer_(logits|score_mm)_kernel$", re.IGNORECASE)


def _wide_weight_gemm(kernel: KernelRow) -> bool:
    """A GEMM whose weights may be 16-bit: nothing in its name or its launching op says narrower."""
    return not (_NOT_WIDE_WEIGHTS.search(kernel.name) or "scaled_mm" in (kernel.launched_by or ""))


def _levers(profile: Profile) -> list[Candidate]:
    levers: list[Candidate] = []
    dense = fragmentation(profile, [GEMM_TC], keep=_wide_weight_gemm)
    if dense.share > 0:
        levers.append(
            Candidate(
                name="fp8-weights", kind="lever", target=GEMM_TC, share=dense.share,
                share_of=f"{category_label(GEMM_TC)} over 16-bit weights",
                amdahl_bound=amdahl(dense.share, 2.0), kernel_speedup=2.0,
                speedup_source="assumed: decode GEMMs are bound by weight bytes, fp8 halves them vs bf16 (GEMMs whose "
                               "weights are already 8-bit or narrower, and the indexer's q x K, left out)",
                fragmentation=dense,
                risk="weight quantisation changes every logit; needs an accuracy evaluation",
                changes_selection=True, needs_graph=False,
            )
        )
    return levers


def _does_not_fit(profile: Profile, opt: Optimization, model: str | None, enabled: set[str]) -> str | None:
    """Why `opt` is no candidate for this profile although its category is there, or None."""
    if model is not None and model != opt.model:
        return f"{opt.name} is written for {opt.model}"
    if opt.target_kernels and opt.name not in enabled and not _runs(profile, opt) and not _competes_with_real(profile, opt):
        # the target category's time is spent in kernels this optimisation does not replace
        return f"{opt.name} replaces {opt.target_kernels} kernels, and none of the top five here is one"
    return None


def _largest_without_lever(profile: Profile, cands: list[Candidate]) -> str | None:
    """The largest category, named when nothing open targets it: a category with no lever is said
    to have none, never passed over for a smaller one that has."""
    top = profile.top_category
    if top is None or top.share < MIN_SHARE:
        return None
    mine = [c for c in cands if top.category in members(c.target)]
    if any(not c.enabled for c in mine):
        return None  # its candidates are in the table
    head = f"the largest category is {top.label} at {top.share:.1%} of {profile.time_label}"
    if mine:
        return f"{head}: {', '.join(c.name for c in mine)} already on, no further lever here"
    enabled = set(profile.meta.get("optimizations") or [])
    reasons = [r for o in OPTIMIZATIONS.values() if top.category in members(o.target_category)
               if (r := _upstream_on_path(profile, o) or _does_not_fit(profile, o, profile_model(profile), enabled))]
    return f"{head}: no lever here ({'; '.join(reasons) or 'dsv4opt has no optimisation for it'})"


def _other_path(profile: Profile):
    """The SGLang path of an embedded profile when it is not the default one, else None. The default
    reproduces a fork's sm_120 fallbacks (docs/workload.md), which the version table's 0.5.14 entry
    (the PyPI wheel) does not describe; another path is that version on its GPU family."""
    from dsv4opt.workload.paths import DEFAULT_PATH, PATHS

    if profile.meta.get("target") != "embedded":
        return None
    path = PATHS.get(str(profile.meta.get("sglang", DEFAULT_PATH)))
    return None if path is None or path.name == DEFAULT_PATH else path


def _upstream_on_path(profile: Profile, opt: Optimization) -> str | None:
    """On an embedded profile of another path than the default, what that SGLang version already runs
    where `opt` works (the version table), or None."""
    from dsv4opt.optimizations import sglang_versions as V

    path = _other_path(profile)
    if path is None:
        return None
    part = V.VERSIONS[path.name].part(opt.name, path.family_code)
    if part is None or not part.upstream or ran_real_kernel(profile, part):
        return None
    return f"{opt.name}: already upstream in SGLang {path.name} ({part.upstream})"


def _competes_with_real(profile: Profile, opt: Optimization) -> bool:
    """On an embedded profile of another path, `opt` replaces a part that ran SGLang's own kernel
    (Marlin's MoE, say), whose kernel names are not the stand-in's `target_kernels`."""
    from dsv4opt.optimizations import sglang_versions as V

    path = _other_path(profile)
    part = V.VERSIONS[path.name].part(opt.name, path.family_code) if path else None
    return part is not None and ran_real_kernel(profile, part)


def ran_real_kernel(profile: Profile, part) -> bool:
    """The profile's baseline ran SGLang's own kernel in the model part a version-table Part competes
    with (meta["kernels"], the Hopper path with `dsv4opt build-kernels` done), so the optimisation is
    measured against the real kernel rather than ruled out as upstream."""
    kernels = profile.meta.get("kernels") or {}
    return bool(part.real_part) and str(kernels.get(part.real_part, "")).startswith("SGLang ")


def _runs(profile: Profile, opt: Optimization) -> bool:
    """One of the profile's top kernels is what `opt` replaces (its category and name pattern)."""
    return any(k.category == opt.target_category and opt.target_kernels in k.name for k in profile.kernels[:5])


def _higher_but_unmeasured(c: Candidate) -> str:
    f = c.fragmentation
    return (f"{c.name} bounds higher ({c.amdahl_bound:.2f}x on {c.share:.1%} glue) but its target is "
            f"{f.launches_per_step:.0f} launches/step with a median kernel of {f.median_kernel_us:.1f} µs spread "
            f"over {f.kernels} kernels: an upper limit, not a measured gain")


def _share_text(c: Candidate) -> str:
    """What a candidate's share is of, in a sentence: "the indexer and mhc_pre parts", "attention"."""
    if c.share_of.startswith("parts "):
        names = c.share_of.removeprefix("parts ").split(", ")
        return "the " + (" and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]) + \
            (" parts" if len(names) > 1 else " part")
    return category_label(c.target)


def speculative(c: Candidate) -> bool:
    """An unmeasured bound over thousands of tiny glue launches: fusing or compiling them removes
    launches, not all their time, so the bound ranks nothing until a measurement is on record."""
    return c.target == GLUE_TARGET and c.kernel_speedup is None and c.fragmentation.tiny


def sglang_version_notes(profile: Profile, cands: list[Candidate]) -> list[str]:
    """On a profile of an SGLang server, or of the embedded workload on another SGLang path than the
    default, what that version already does (optimizations/sglang_versions.py): a candidate SGLang
    runs upstream on the profile's GPU family (every family when the profile does not say) is not
    recommended and says so, and a speed-up on record timed against a kernel that version does not
    run is not used."""
    from dsv4opt.optimizations import sglang_versions as V

    meta = profile.meta
    if meta.get("target") == "embedded":
        path = _other_path(profile)
        if path is None:
            return []
        entry, family = V.VERSIONS.get(path.name), path.family_code
    elif meta.get("target") == "sglang":
        version = meta.get("sglang_version")
        entry = V.VERSIONS.get(str(version)) if version else None
        if entry is None:
            return [f"SGLang {version or '(version not recorded)'} is not a version dsv4opt knows ({V.known()}): "
                    "what it already does upstream is not checked"]
        family = V.family_of_device(meta.get("device")) or V.family_of_kernels(k.name for k in profile.kernels)
    else:
        return []
    lines = []
    for c in cands:
        parts = {f: p for f in ([family] if family else V.FAMILIES) if (p := entry.part(c.name, f)) is not None}
        if c.kind != "optimisation" or not parts:
            continue
        against_real = meta.get("target") == "embedded" and all(ran_real_kernel(profile, p) for p in parts.values())
        if against_real:
            # no speed-up of the whole step is on record against SGLang's kernel: said, not ranked on the
            # bound that assumes the part takes no time
            c.fits, c.why_not = None, None
            c.kernel_speedup, c.amdahl_bound = None, amdahl(c.share, None)
            c.notes.insert(0, "; ".join(p.over_real for p in parts.values() if p.over_real)
                          + "; not ranked until it is measured in the step against this profile's kernel")
        if all(p.upstream for p in parts.values()) and not against_real:
            said = "; ".join(f"{V.FAMILIES[f]}: {p.upstream}" for f, p in parts.items())
            c.fits = False
            c.why_not = f"already upstream in SGLang {entry.version} ({said})"
            c.notes.insert(0, c.why_not)
        elif (c.kernel_speedup is not None and c.measured_on == RECORDED_ON
              and not any(p.record_applies for p in parts.values())):
            runs = "; ".join(f"{V.FAMILIES[f]}: {p.sglang_runs}" for f, p in parts.items())
            c.kernel_speedup, c.amdahl_bound = None, amdahl(c.share, None)
            c.speedup_source = (f"the speed-up on record was timed against a kernel SGLang {entry.version} does not run "
                                f"here ({runs}): bound assumes the target takes no time")
    return lines


def recommend(profile: Profile, enabled: list[str] | None = None) -> Recommendation:
    from dsv4opt.decision.phase import not_decode

    phase = not_decode(profile)
    if phase is not None:  # decode levers would be advice for another workload
        return Recommendation(candidates=[], chosen=None, explanation=[phase.line()])
    cands = candidates(profile, enabled)
    version_lines = sglang_version_notes(profile, cands)
    open_ = [c for c in cands if not c.enabled and c.share >= MIN_SHARE]
    applicable = [c for c in open_ if c.kind == "optimisation" and c.fits]
    # not ranked, whatever their share: each gets its line saying why
    unsure = [c for c in cands if not c.enabled and c.share > 0 and c.kind == "optimisation" and c.fits is None]
    levers = [c for c in open_ if c.kind == "lever"]
    firm = [c for c in applicable if not speculative(c)]
    best_opt = max(firm, key=lambda c: c.amdahl_bound, default=None)
    best_guess = max([c for c in applicable if speculative(c)], key=lambda c: c.amdahl_bound, default=None)
    if best_guess is not None and (best_opt is None or best_opt.amdahl_bound < MIN_GAIN):
        best_opt, best_guess = best_guess, None
    best_lever = max(levers, key=lambda c: c.amdahl_bound, default=None)

    lines: list[str] = list(version_lines)
    if profile.time_basis != "gpu":
        lines.append("this profile ranks CPU operators by self time (no GPU): shares are CPU shares")
    largest = _largest_without_lever(profile, cands)
    if largest:
        lines.append(largest)
    if best_opt is not None and best_opt.amdahl_bound >= MIN_GAIN:
        chosen = best_opt
        lines.append(
            f"apply {chosen.name}: {_share_text(chosen)} is {chosen.share:.1%} of {profile.time_label}; "
            f"step speed-up at most {chosen.amdahl_bound:.2f}x ({chosen.speedup_source})."
        )
        lines.append(f"risk: {chosen.risk}; `dsv4opt apply {chosen.name}` runs its correctness gate first.")
        if best_guess is not None and best_guess.amdahl_bound > chosen.amdahl_bound:
            lines.append(f"{_higher_but_unmeasured(best_guess)}; `dsv4opt apply {best_guess.name}` measures it "
                         "behind its gate.")
        if best_lever is not None and best_lever.amdahl_bound > chosen.amdahl_bound:
            lines.append(f"{_higher_but_unmeasured(best_lever)}, and dsv4opt has no gated switch for it.")
    elif best_lever is not None:
        chosen = best_lever
        best = f" (the best, {best_opt.name}, bounds {best_opt.amdahl_bound:.2f}x: {best_opt.speedup_source})" \
            if best_opt is not None else ""
        lines.append(
            f"no applicable optimisation promises {MIN_GAIN:.2f}x or more{best}; the largest target with a lever is "
            f"{_share_text(chosen)} at {chosen.share:.1%} (bound {chosen.amdahl_bound:.2f}x): {chosen.name} "
            f"(advice: dsv4opt has no switch for it, `apply` cannot apply it). Risk: {chosen.risk}."
        )
    else:
        chosen = None
        lines.append(f"nothing left with a target above {MIN_SHARE:.0%} of {profile.time_label}")
    for c in unsure:
        lines.append(f"{c.name} would target {c.share:.1%} ({_share_text(c)}) but {c.notes[0]}: not recommended")
    summary = glue_of(profile)
    regions = summary.regions[:GLUE_SECTION] if summary else []
    plans = [glue_plan(profile, o.name) for o in OPTIMIZATIONS.values()
             if summary is not None and o.target_category == GLUE_TARGET]
    return Recommendation(candidates=cands, chosen=chosen, explanation=lines, glue_regions=regions, glue_plans=plans)
