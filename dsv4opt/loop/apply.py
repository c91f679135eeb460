"""apply / revert: gate an optimisation on its check, switch it on, re-profile, compare."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dsv4opt.analysis.compare import throughput_change
from dsv4opt.analysis.profile import Profile
from dsv4opt.capture.result import Progress, no_progress
from dsv4opt.capture.settings import EmbeddedSettings
from dsv4opt.errors import CheckFailed, DsvOptError
from dsv4opt.loop.settings import settings_from_profile
from dsv4opt.optimizations.registry import CheckResult, get
from dsv4opt.state import CheckVerdict, HistoryEntry, State, load_state, save_state

ProfileFn = Callable[[EmbeddedSettings], tuple[Profile, Path]]


@dataclass
class ApplyResult:
    name: str
    check: CheckResult
    enabled: list[str]
    before_path: Path | None = None
    after_path: Path | None = None
    before: Profile | None = None
    after: Profile | None = None
    switched_back: str | None = None  # why it was left off after the re-profile


def _now() -> str:
    return dt.datetime.now().isoformat(timespec="seconds")


def _default_profile_fn(settings: EmbeddedSettings) -> tuple[Profile, Path]:
    from dsv4opt.loop.profiles import profile_embedded

    return profile_embedded(settings)


def record_profile(path: Path, action: str = "profile") -> None:
    """Remember `path` as the last profile (what apply compares against and re-profiles like)."""
    state = load_state()
    state.last_profile = str(Path(path).absolute())  # absolute: the state is read from subfolders too
    state.history.append(HistoryEntry(action=action, profile=state.last_profile, date=_now()))
    save_state(state)


def record_check(result: CheckResult) -> CheckVerdict:
    """Keep the latest check verdict per optimisation, for `dsv4opt list`."""
    verdict = CheckVerdict(result.passed, result.device, _now())
    state = load_state()
    state.checks[result.name] = verdict
    save_state(state)
    return verdict


def check_all(progress: Progress = no_progress) -> dict[str, CheckResult]:
    """Run every registered optimisation's gate on this device and record each verdict as it comes;
    progress hears the gates done of the total."""
    from dsv4opt.optimizations.registry import OPTIMIZATIONS

    names = list(OPTIMIZATIONS)
    results = {}
    for done, name in enumerate(names):
        progress.runs(done, len(names), f"{name}'s gate")
        progress.stage(f"checking {name}", None)
        results[name] = OPTIMIZATIONS[name].check(None)
        record_check(results[name])
    progress.runs(len(names), len(names), None)
    return results


def apply_optimisation(
    name: str,
    *,
    concurrency: int | None = None,
    reprofile: bool = True,
    keep: bool = False,
    on_check: Callable[[CheckResult], None] = lambda r: None,
    on_before: Callable[[Path], None] = lambda p: None,
    profile_fn: ProfileFn = _default_profile_fn,
) -> ApplyResult:
    """Check `name` on this device, switch it on, re-profile like the last profile, keep both.

    Refused before anything runs when the optimisation cannot run on the device the loop profiles
    on. Nothing changes when the check fails. A re-profile slower than before beyond the measured
    noise leaves it off (the profiles kept, `switched_back` says why) unless `keep`. The state is
    written only after the re-profile is saved, so an interrupted run leaves the previous state and
    profiles as they were.
    """
    opt = get(name)
    state = load_state()
    if name in state.enabled:
        raise DsvOptError(f"{name} is already on; `dsv4opt revert {name}` switches it off")
    device = _loop_device(state)
    if device not in opt.devices:
        raise DsvOptError(
            f"{name} runs on {' or '.join(opt.devices)}; this loop profiles on the {device}, so it would only "
            f"make every later profile fail: nothing was run or changed"
        )

    before, before_path, settings = None, None, None
    if reprofile:
        before, before_path, settings = _baseline(state, concurrency, profile_fn, on_before)

    check = opt.check(settings.device if settings else None)
    on_check(check)
    if not check.passed:
        raise CheckFailed(f"{name}: correctness check failed on {check.device}: {check.summary}; nothing was changed")

    enabled = _registry_order(state.enabled + [name])
    result = ApplyResult(name=name, check=check, enabled=enabled, before=before, before_path=before_path)
    if reprofile:
        assert settings is not None
        settings = dataclasses.replace(settings, optimizations=enabled, out=None, trace_dir=None)
        result.after, result.after_path = profile_fn(settings)
        change = throughput_change(result.before, result.after) if result.before else None
        if change is not None and change.slower and not keep:
            noise = "the measured noise" if change.noise_measured else "5% (the noise was not measured)"
            result.switched_back = (f"{name} left off: the re-profile is {change.speedup:.2f}x, slower beyond "
                                    f"{noise}; the profiles are kept, --keep switches it on anyway")
    state = load_state()  # re-read: the before-profile may have been recorded meanwhile
    if result.switched_back:
        result.enabled = list(state.enabled)
        state.checks[name] = CheckVerdict(True, check.device, _now())
        state.history.append(HistoryEntry(action="apply-declined", name=name, profile=str(Path(result.after_path).absolute()),
                                          date=_now()))
        save_state(state)
        return result
    state.enabled = enabled
    state.checks[name] = CheckVerdict(True, check.device, _now())
    if result.after_path is not None:
        state.last_profile = str(Path(result.after_path).absolute())
    state.history.append(HistoryEntry(action="apply", name=name, profile=state.last_profile, date=_now()))
    save_state(state)
    return result


def _loop_device(state: State) -> str:
    """The device the loop's profiles run on: the last profile's, else this machine's default."""
    last = Path(state.last_profile) if state.last_profile else None
    if last is not None and last.exists():
        kind = Profile.load(last).meta.get("device_kind")
        if kind in ("cuda", "cpu"):
            return kind
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def revert_optimisation(name: str) -> list[str]:
    get(name)
    state = load_state()
    if name not in state.enabled:
        on = ", ".join(state.enabled) or "none"
        raise DsvOptError(f"{name} is not on (on: {on})")
    state.enabled = [n for n in state.enabled if n != name]
    state.history.append(HistoryEntry(action="revert", name=name, date=_now()))
    save_state(state)
    return state.enabled


def _baseline(
    state: State, concurrency: int | None, profile_fn: ProfileFn, on_before: Callable[[Path], None]
) -> tuple[Profile, Path, EmbeddedSettings]:
    """The profile to compare against: the last one (re-profiled if a concurrency is asked that differs)."""
    last = Path(state.last_profile) if state.last_profile else None
    if last is not None and last.exists():
        profile = Profile.load(last)
        settings = settings_from_profile(profile, last)
        if concurrency is None or concurrency == settings.concurrency:
            return profile, last, settings
        settings = dataclasses.replace(settings, concurrency=concurrency)
    else:
        settings = EmbeddedSettings(concurrency=concurrency or 32)
    settings = dataclasses.replace(settings, optimizations=list(state.enabled), out=None, trace_dir=None)
    profile, path = profile_fn(settings)
    on_before(path)
    record_profile(path)
    return profile, path, settings_from_profile(profile, path)


def _registry_order(names: list[str]) -> list[str]:
    from dsv4opt.optimizations.registry import OPTIMIZATIONS

    return [n for n in OPTIMIZATIONS if n in set(names)]
