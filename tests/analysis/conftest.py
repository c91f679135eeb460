"""Whole-model runs here take the workload's plain-torch kernels (see tests/conftest.py)."""

import pytest


@pytest.fixture(autouse=True)
def _torch_kernels(torch_path):
    yield
