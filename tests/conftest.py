"""Suite-wide fixtures."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """The test machines are small and shared: one torch thread per process avoids oversubscription
    (child processes started by the tests set OMP_NUM_THREADS=1 themselves)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
