"""apply/revert state machine: gate first, state written last, nothing lost on failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4opt.errors import CheckFailed, DsvOptError, StateError
from dsv4opt.loop.apply import apply_optimisation, record_profile, revert_optimisation
from dsv4opt.optimizations.registry import CheckResult, Optimization
from dsv4opt.state import load_state, reset_state, state_path
from tests.decision.profiles import make_profile


def _embedded(profile, concurrency=32, optimizations=()):
    profile.meta.update(target="embedded", concurrency=concurrency, optimizations=list(optimizations),
                        config="dsv4-tiny", context=64, steps=2, warmup=1, device="cpu")
    return profile


class Recorder:
    """A profile function that writes real profile files and remembers what it was asked;
    `windows` gives each variant's timed ms/step windows (before / after)."""

    def __init__(self, tmp: Path, shares: dict[str, float], windows: dict[str, list[float]] | None = None):
        self.tmp, self.shares, self.calls, self.windows = tmp, shares, [], windows

    def __call__(self, settings):
        self.calls.append(settings)
        which = "after" if settings.optimizations else "before"
        attn = self.shares[which]
        throughput = None
        if self.windows:
            w = self.windows[which]
            throughput = {"ms_per_step": sorted(w)[len(w) // 2], "tokens_per_s": 1000.0 / sorted(w)[len(w) // 2],
                          "ms_per_step_windows": w}
        prof = _embedded(make_profile([("attn_kernel", "attention", 10, attn), ("gemm", "gemm_tc", 10, 100.0 - attn)],
                                      throughput=throughput), settings.concurrency, settings.optimizations)
        path = self.tmp / f"p{len(self.calls)}.json"
        prof.save(path)
        return prof, path


@pytest.fixture(autouse=True)
def gpu_loop(monkeypatch):
    """These tests drive the state machine with fake profiles: the loop's device is a GPU."""
    import dsv4opt.loop.apply as apply

    monkeypatch.setattr(apply, "_loop_device", lambda state: "cuda")


@pytest.fixture
def checks(monkeypatch):
    verdicts = {"mma-attn": True, "bf16-gemm": True}

    def fake_check(self, device=None):
        ok = verdicts[self.name]
        return CheckResult(self.name, ok, "cpu", {"rel_err": 0.003 if ok else 0.5}, {"rel_err": 0.01},
                           "rel err within bound" if ok else "rel err 0.5 > 0.01")

    monkeypatch.setattr(Optimization, "check", fake_check)
    return verdicts


def test_apply_profiles_baseline_then_after_and_records_state(tmp_path, checks):
    rec = Recorder(tmp_path, {"before": 60.0, "after": 10.0})
    result = apply_optimisation("mma-attn", concurrency=16, profile_fn=rec)
    assert [s.optimizations for s in rec.calls] == [[], ["mma-attn"]]
    assert all(s.concurrency == 16 for s in rec.calls)
    assert result.before.category_share("attention") == pytest.approx(0.6)
    assert result.after.category_share("attention") == pytest.approx(0.1)
    state = load_state()
    assert state.enabled == ["mma-attn"]
    assert state.last_profile == str(result.after_path)
    assert result.before_path.exists() and result.after_path.exists()


def test_apply_reuses_the_last_profile_settings(tmp_path, checks):
    rec = Recorder(tmp_path, {"before": 60.0, "after": 10.0})
    base = _embedded(make_profile([("k", "attention", 1, 1.0)]), concurrency=64)
    base_path = tmp_path / "base.json"
    base.save(base_path)
    record_profile(base_path)
    apply_optimisation("mma-attn", profile_fn=rec)
    assert len(rec.calls) == 1 and rec.calls[0].concurrency == 64 and rec.calls[0].context == 64


def test_failed_check_changes_nothing(tmp_path, checks):
    checks["mma-attn"] = False
    rec = Recorder(tmp_path, {"before": 60.0, "after": 10.0})
    base = _embedded(make_profile([("k", "attention", 1, 1.0)]))
    base.save(tmp_path / "base.json")
    record_profile(tmp_path / "base.json")
    before = state_path().read_bytes()
    with pytest.raises(CheckFailed, match="rel err 0.5"):
        apply_optimisation("mma-attn", profile_fn=rec)
    assert state_path().read_bytes() == before
    assert rec.calls == []


def test_interrupted_reprofile_keeps_previous_state(tmp_path, checks):
    base = _embedded(make_profile([("k", "attention", 1, 1.0)]))
    base.save(tmp_path / "base.json")
    record_profile(tmp_path / "base.json")
    before = state_path().read_bytes()

    def interrupted(settings):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        apply_optimisation("mma-attn", profile_fn=interrupted)
    assert state_path().read_bytes() == before
    assert load_state().enabled == []


def test_already_on_and_unknown_names(tmp_path, checks):
    apply_optimisation("mma-attn", reprofile=False)
    with pytest.raises(DsvOptError, match="already on"):
        apply_optimisation("mma-attn", reprofile=False)
    with pytest.raises(DsvOptError, match="known: mma-attn, bf16-gemm"):
        apply_optimisation("flash-everything", reprofile=False)


def test_revert(tmp_path, checks):
    apply_optimisation("bf16-gemm", reprofile=False)
    apply_optimisation("mma-attn", reprofile=False)
    assert load_state().enabled == ["mma-attn", "bf16-gemm"]  # registry order
    assert revert_optimisation("mma-attn") == ["bf16-gemm"]
    with pytest.raises(DsvOptError, match="not on"):
        revert_optimisation("mma-attn")


def test_corrupt_state_is_reported_and_reset_keeps_it(tmp_path):
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{ not json")
    with pytest.raises(StateError, match="status --reset"):
        load_state()
    kept = reset_state()
    assert kept is not None and kept.read_text() == "{ not json"
    assert load_state().enabled == []


def test_state_file_is_valid_json_with_schema(tmp_path, checks):
    apply_optimisation("mma-attn", reprofile=False)
    data = json.loads(state_path().read_text())
    assert data["schema"] == "dsv4opt.state/1" and data["enabled"] == ["mma-attn"]
    assert data["checks"]["mma-attn"]["passed"] is True


def test_a_reprofile_slower_beyond_the_noise_leaves_it_off(tmp_path, checks):
    """Every timed window after is slower than every window before: switched back, profiles kept."""
    rec = Recorder(tmp_path, {"before": 60.0, "after": 10.0}, {"before": [10.0, 10.2, 10.1], "after": [10.6, 10.7, 10.5]})
    result = apply_optimisation("bf16-gemm", concurrency=16, profile_fn=rec)
    assert result.switched_back and "slower beyond the measured noise" in result.switched_back
    assert load_state().enabled == [] and result.after_path.exists() and result.before_path.exists()
    kept = apply_optimisation("bf16-gemm", concurrency=16, profile_fn=rec, keep=True)
    assert kept.switched_back is None and load_state().enabled == ["bf16-gemm"]


def test_a_change_inside_the_noise_is_kept(tmp_path, checks):
    rec = Recorder(tmp_path, {"before": 60.0, "after": 10.0}, {"before": [10.0, 10.6, 10.1], "after": [10.5, 10.7, 10.4]})
    result = apply_optimisation("bf16-gemm", concurrency=16, profile_fn=rec)
    assert result.switched_back is None and load_state().enabled == ["bf16-gemm"]
