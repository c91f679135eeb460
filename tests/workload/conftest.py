"""The workload's CPU tests run microsecond-sized operators: one intra-op thread keeps them fast
and steady on a shared machine."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_cpu_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
