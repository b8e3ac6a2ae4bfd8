"""Shared fixtures for the operator tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    """Small eigen-problems run faster (and time more stably) on one thread of a shared box."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
