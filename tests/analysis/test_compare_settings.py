"""compare refuses profiles run under different settings; a per-part setting (which kernel ran each
part) is compared part by part, and a new setting is one entry in SETTINGS."""

from __future__ import annotations

import pytest

from dsv4opt.analysis import compare
from dsv4opt.analysis.compare import require_comparable, setting_differences
from dsv4opt.errors import DsvOptError
from tests.decision.profiles import make_profile


def _profile(**meta):
    return make_profile([("k", "attention", 10, 100.0)], meta={"target": "embedded", "concurrency": 8, **meta})


def test_sglang_path_differs():
    with pytest.raises(DsvOptError, match=r"different settings \(sglang: 0\.5\.14 -> 0\.5\.23\).*--force"):
        require_comparable(_profile(sglang="0.5.14"), _profile(sglang="0.5.23"))
    assert require_comparable(_profile(sglang="0.5.14"), _profile(sglang="0.5.23"), force=True) == [
        "sglang: 0.5.14 -> 0.5.23"]


def test_a_profile_without_the_path_ran_the_first_one():
    assert setting_differences(_profile(), _profile(sglang="0.5.14")) == []
    assert setting_differences(_profile(), _profile(sglang="0.5.23")) == ["sglang: 0.5.14 -> 0.5.23"]


def test_the_settings_a_profile_recorded_are_read_too():
    assert setting_differences(_profile(settings={"sglang": "0.5.23"}), _profile(sglang="0.5.14")) == [
        "sglang: 0.5.23 -> 0.5.14"]


def test_kernels_per_part_are_compared_part_by_part():
    real = {"attention": "real SGLang kernel", "moe": "stand-in"}
    other = {"attention": "stand-in", "moe": "stand-in", "indexer": "stand-in"}
    assert setting_differences(_profile(kernels=real), _profile(kernels=other)) == [
        "kernels.attention: real SGLang kernel -> stand-in", "kernels.indexer: - -> stand-in"]
    assert setting_differences(_profile(kernels=real), _profile(kernels=dict(real))) == []
    assert setting_differences(_profile(kernels=real), _profile()) == []  # absent on one side: not checked


def test_a_new_setting_is_one_entry(monkeypatch):
    monkeypatch.setitem(compare.SETTINGS, "attention_backend", None)
    a, b = _profile(attention_backend="flashmla"), _profile(attention_backend="flashinfer")
    with pytest.raises(DsvOptError, match="attention_backend: flashmla -> flashinfer"):
        require_comparable(a, b)
