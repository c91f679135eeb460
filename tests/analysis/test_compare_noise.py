"""compare calls a change faster or slower only beyond the measured spread of the timed windows."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dsv4opt.analysis.compare import ThroughputChange, compare_profiles
from dsv4opt.cli import app
from tests.decision.profiles import make_profile


def _profile(windows: list[float]):
    ms = sorted(windows)[len(windows) // 2]
    return make_profile([("k", "attention", 10, 100.0)], meta={"concurrency": 8},
                        throughput={"tokens_per_s": 8000.0 / ms, "ms_per_step": ms, "ms_per_step_windows": windows})


@pytest.mark.parametrize("before, after, verdict", [
    ([10.0, 10.4, 10.2], [10.1, 10.3, 9.9], "within noise"),  # the windows overlap
    ([10.0, 10.4, 10.2], [9.0, 9.1, 9.2], "faster"),  # every window after below every window before
    ([10.0, 10.4, 10.2], [10.5, 10.6, 10.7], "slower"),
    ([10.0], [9.9], "not called"),  # timed once: spread unknown, 1% is not called
    ([10.0], [10.4], "not called"),  # a small slow-down timed once: apply must not switch back on it
    ([10.0], [8.0], "faster"),  # beyond 5% with the spread unknown
    ([10.0], [11.0], "slower"),
], ids=["overlap", "faster", "slower", "once-small", "once-small-slower", "once-large", "once-large-slower"])
def test_verdict_against_the_spread(before, after, verdict):
    change = compare_profiles(_profile(before), _profile(after)).change
    assert change.verdict == verdict


def test_the_line_says_within_noise_and_shows_the_spread():
    line = ThroughputChange(10.2, 10.1, (10.0, 10.4, 10.2), (9.9, 10.3, 10.1)).line()
    assert line == ("ms/step 10.20 -> 10.10: 1.01x, within noise "
                    "(timed windows 10.00-10.40 -> 9.90-10.30 ms/step, 3 and 3 windows)")


def test_old_profiles_say_the_spread_is_unknown():
    line = ThroughputChange(10.0, 9.9, (), (9.8, 10.0, 9.9)).line()
    assert "not called" in line and "spread is unknown (before timed once" in line


def test_compare_prints_the_noise_verdict_once(tmp_path):
    a = _profile([10.0, 10.4, 10.2]).save(tmp_path / "a.json")
    b = _profile([10.1, 10.3, 9.9]).save(tmp_path / "b.json")
    r = CliRunner().invoke(app, ["compare", str(a), str(b)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert r.output.count("within noise") == 1 and r.output.count("1.01x") == 1
    assert "tokens/s 784.31 -> 792.08, ms/step 10.20 -> 10.10" in r.output
