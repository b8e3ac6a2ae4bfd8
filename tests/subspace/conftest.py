"""Shared helpers of the gpext.subspace tests."""

import pytest

from gpext.fit import minibatch_indices


class SameOrderSampler:
    """Batch sampler drawing the index batches of ``minibatch_indices`` from ``generator``, so
    a DataLoader sees the batches the tensor path of the same seed sees."""

    def __init__(self, n, batch_size, generator):
        self.n, self.batch_size, self.generator = n, batch_size, generator

    def __iter__(self):
        # min_size=1: the loader path merges a one-row batch itself (batch-norm networks)
        for idx in minibatch_indices(self.n, self.batch_size, generator=self.generator):
            yield idx.tolist()


@pytest.fixture
def same_order_sampler():
    """The :class:`SameOrderSampler` class."""
    return SameOrderSampler
