"""How figures read: no "-0.00 µs", a sign on a change, plurals that agree."""

from __future__ import annotations

import pytest

from dsv4opt.display import MISSING, change, count, duration, pct


@pytest.mark.parametrize("us, text", [(-0.001, "0.00 µs"), (-0.04, "-0.04 µs"), (0.0, "0.0 µs"),
                                      (-0.0004, "0.00 µs"), (-1500.0, "-1.50 ms"), (-1e-9 * 1000, "0.00 µs")],
                         ids=["tiny-negative", "small-negative", "zero", "rounds-to-zero", "ms", "ns"])
def test_a_duration_that_rounds_to_zero_has_no_sign(us, text):
    assert duration(us) == text


def test_a_share_that_rounds_to_zero_has_no_sign():
    assert pct(-0.00001) == "0.0%" and pct(-0.002) == "-0.2%" and pct(None) == MISSING


@pytest.mark.parametrize("us, text", [(4130.0, "+4.13 ms"), (-624790.0, "-624.79 ms"), (0.0, "0.0 µs"),
                                      (-0.001, "0.00 µs"), (None, MISSING)])
def test_a_change_carries_its_sign(us, text):
    assert change(us) == text


def test_counts_agree_with_their_noun():
    assert count(1, "profiled step") == "1 profiled step" and count(3, "step") == "3 steps" and count(0, "step") == "0 steps"


def test_a_path_under_the_working_folder_is_shown_relative(tmp_path, monkeypatch):
    from dsv4opt.display import shown_path

    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "a" / "p.json") == "a/p.json"
    assert shown_path("/elsewhere/p.json") == "/elsewhere/p.json"
