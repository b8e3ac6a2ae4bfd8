"""Test-wide settings.

Torch runs single-threaded in the tests: the models under test are small, where intra-op threads
add overhead, and on a shared 2-core CI machine oversubscribed threads slow everything down by an
order of magnitude.  Set ``GPEXT_TEST_THREADS`` to override.
"""

import os

import torch

torch.set_num_threads(int(os.environ.get("GPEXT_TEST_THREADS", "1")))
