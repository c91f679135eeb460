"""profile_embedded's refusals (the full run is tested through the CLI in tests/cli/test_profile.py)."""

import pytest
import torch

from dsv4opt.capture import embedded
from dsv4opt.loop.profiles import profile_embedded
from dsv4opt.capture.settings import EmbeddedSettings
from dsv4opt.errors import CaptureError, DsvOptError


def test_cuda_without_a_gpu_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CaptureError, match="--device cpu"):
        profile_embedded(EmbeddedSettings(device="cuda", out=tmp_path / "p.json"))


def test_out_must_be_json(tmp_path):
    with pytest.raises(CaptureError, match=".json"):
        profile_embedded(EmbeddedSettings(device="cpu", config="dsv4-tiny", out=tmp_path / "p.txt"))


def test_layers_out_of_range(tmp_path):
    with pytest.raises(DsvOptError, match="--layers"):
        profile_embedded(EmbeddedSettings(device="cpu", config="dsv4-tiny", layers=99, out=tmp_path / "p.json"))


def test_too_big_is_refused_before_allocating(monkeypatch):
    """The flash config on a pretend 24 GiB GPU: refused with the estimate and what to lower."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (24 << 30, 24 << 30))
    from dsv4opt.workload.config import ModelConfig

    settings = EmbeddedSettings(concurrency=32, context=8192)
    with pytest.raises(CaptureError, match="lower --layers") as exc:
        embedded._refuse_if_too_big(ModelConfig.from_name("dsv4-flash"), settings, torch.device("cuda"), torch.bfloat16, 64)
    assert "GiB" in str(exc.value)
    # Four layers fit in the same pretend GPU.
    embedded._refuse_if_too_big(ModelConfig.from_name("dsv4-flash").with_layers(4), settings, torch.device("cuda"), torch.bfloat16, 64)


def test_flash_on_a_small_host_is_refused(monkeypatch):
    monkeypatch.setattr(embedded, "_free_host_memory", lambda: 8 << 30)
    from dsv4opt.workload.config import ModelConfig

    with pytest.raises(CaptureError, match="free on the cpu"):
        embedded._refuse_if_too_big(ModelConfig.from_name("dsv4-flash"), EmbeddedSettings(), torch.device("cpu"), torch.float32, 64)
