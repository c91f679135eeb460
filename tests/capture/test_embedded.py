"""profile_embedded's refusals (the full run is tested through the CLI in tests/cli/test_profile.py)."""

import pytest
import torch

from dsv4opt.capture import rank_run
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
        rank_run.refuse_if_too_big(_plan(ModelConfig.from_name("dsv4-flash"), "cuda", torch.bfloat16), settings)
    assert "GiB" in str(exc.value)
    # Four layers fit in the same pretend GPU.
    rank_run.refuse_if_too_big(_plan(ModelConfig.from_name("dsv4-flash").with_layers(4), "cuda", torch.bfloat16), settings)


def test_flash_on_a_small_host_is_refused(monkeypatch):
    monkeypatch.setattr(rank_run, "_free_host_memory", lambda: 8 << 30)
    from dsv4opt.workload.config import ModelConfig

    with pytest.raises(CaptureError, match="free on the cpu"):
        rank_run.refuse_if_too_big(_plan(ModelConfig.from_name("dsv4-flash"), "cpu", torch.float32), EmbeddedSettings())


def test_ranks_sharing_a_host_are_refused_together(monkeypatch):
    """Four tiny ranks on one CPU share its RAM: a budget that holds one of them but not four is refused."""
    from dsv4opt.workload.config import ModelConfig
    from dsv4opt.workload.memory import HOST_WORKSPACE, estimate_memory

    settings = EmbeddedSettings(concurrency=2, context=24)
    plan = _plan(ModelConfig.from_name("dsv4-tiny"), "cpu", torch.float32)
    one = estimate_memory(plan.cfg.with_expert_parallel(4), 2, 24, elem_bytes=4, max_new_tokens=64, ranks=4,
                          workspace=HOST_WORKSPACE).total
    monkeypatch.setattr(rank_run, "_free_host_memory", lambda: int(2 * one / rank_run.MEMORY_HEADROOM))
    rank_run.refuse_if_too_big(plan, settings, ranks=4)
    with pytest.raises(CaptureError, match="for each of 4 ranks"):
        rank_run.refuse_if_too_big(plan, settings, ranks=4, sharing=4)


def test_four_tiny_ranks_fit_a_small_host(monkeypatch):
    """A CPU has no cuBLAS workspace: four tiny ranks fit the 2 GiB a busy 2-core CI host may have free
    (a 1 GiB GPU workspace a rank once refused them at 3.7 GiB)."""
    from dsv4opt.workload.config import ModelConfig

    plan = _plan(ModelConfig.from_name("dsv4-tiny"), "cpu", torch.float32)
    monkeypatch.setattr(rank_run, "_free_host_memory", lambda: 2 << 30)
    rank_run.refuse_if_too_big(plan, EmbeddedSettings(concurrency=2, context=24), ranks=4, sharing=4)


def test_free_host_memory_counts_the_page_cache(tmp_path):
    """MemAvailable (free pages plus the cache the kernel drops), not MemFree."""
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24000000 kB\nMemFree:         3800000 kB\nMemAvailable:   22000000 kB\n")
    assert rank_run._free_host_memory(str(info)) == 22000000 * 1024


def _plan(cfg, device: str, dtype, layout: str = "tp4", graph_context: int = 0) -> rank_run.RunPlan:
    from dsv4opt.workload.layout import Layout

    return rank_run.RunPlan(device=torch.device(device), config_name=cfg.name, cfg=cfg, dtype=dtype, max_new=64,
                            use_graph=False, deploy=Layout.from_name(layout).deploy(cfg), graph_context=graph_context)
