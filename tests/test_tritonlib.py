"""The device's limits: read from the device, capped by DSV4OPT_SHARED_MEMORY_LIMIT, or a compile-only target's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dsv4opt import tritonlib
from dsv4opt.errors import DsvOptError

H200 = tritonlib.DeviceLimits("NVIDIA H200", (9, 0), 132, 232448, 233472, 65536, 2048)


@pytest.fixture
def an_h200(monkeypatch):
    props = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
                            shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472,
                            regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    tritonlib._read_limits.cache_clear()
    yield
    tritonlib._read_limits.cache_clear()


def test_limits_are_read_from_the_device(an_h200, monkeypatch):
    monkeypatch.delenv(tritonlib.SHARED_LIMIT_ENV, raising=False)
    assert tritonlib.device_limits(torch.device("cuda", 0)) == H200
    assert tritonlib.sm_count(torch.device("cuda", 0)) == 132


def test_the_cap_lowers_shared_memory_a_block_and_nothing_else(an_h200, monkeypatch):
    monkeypatch.setenv(tritonlib.SHARED_LIMIT_ENV, "101376")
    got = tritonlib.device_limits(torch.device("cuda", 0))
    assert got.shared_per_block == 101376 and got.shared_per_sm == H200.shared_per_sm and got.sms == 132
    monkeypatch.setenv(tritonlib.SHARED_LIMIT_ENV, "999999")  # a cap above the device's changes nothing
    assert tritonlib.device_limits(torch.device("cuda", 0)).shared_per_block == 232448


def test_a_cap_that_is_not_a_number_is_one_line(an_h200, monkeypatch):
    monkeypatch.setenv(tritonlib.SHARED_LIMIT_ENV, "99KB")
    with pytest.raises(DsvOptError, match=r"^DSV4OPT_SHARED_MEMORY_LIMIT='99KB' is not a number of bytes$"):
        tritonlib.device_limits(torch.device("cuda", 0))


def test_a_compile_only_target_answers_for_the_device_and_lets_triton_take_cpu_tensors():
    sm120 = tritonlib.DeviceLimits("sm_120", (12, 0), 188, 101376, 102400, 65536, 1536)
    t = torch.zeros(1)
    assert not tritonlib.compile_only()
    with tritonlib.compile_only_target(sm120):
        assert tritonlib.device_limits(torch.device("cuda")) is sm120
        assert tritonlib.compile_only() and tritonlib.on_gpu(t) and tritonlib.runs_triton(t)
    assert not tritonlib.compile_only() and not tritonlib.on_gpu(t)
