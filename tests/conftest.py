"""Test-wide settings.

Tiny models run thousands of small matmuls; with two OpenMP threads on a
shared 2-core machine each one can wait milliseconds at a barrier, so tests
use one thread except those on real models (marked `real`).
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _threads(request):
    wanted = 2 if request.node.get_closest_marker("real") else 1
    before = torch.get_num_threads()
    torch.set_num_threads(wanted)
    yield
    torch.set_num_threads(before)
