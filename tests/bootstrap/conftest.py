"""Run the bootstrap tests single-threaded: on shared 2-core machines this is several times
faster for the small matmuls they use (thread contention dominates otherwise)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
