"""Shared fixtures for the subspace tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    """The loops here run many tiny ops: one thread avoids oversubscription on a loaded machine."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
