"""Shared fixtures of the gpext_bench tests."""

import pytest

import gpext_bench.methods_subspace as ms


@pytest.fixture(autouse=True)
def _fresh_subspace_run_cache():
    """Every test starts without a cached weight-space run.

    ``fit_subspace_run`` keeps one run per split (the registered methods share it), and its
    ``epochs`` / ``rank`` arguments only apply when a new run is trained; a run cached by an
    earlier test of the same split would otherwise be returned in place of the one asked for.
    """
    ms._CACHE.clear()
    yield
    ms._CACHE.clear()
