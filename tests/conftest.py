"""Test-wide settings.

Tiny models run thousands of small matmuls; with two OpenMP threads on a
shared 2-core machine each one can wait milliseconds at a barrier, so tests
use one thread except those on real models (marked `real`).

The session reports its peak memory (resident set) at the end and fails if it
went past AUGURY_TEST_MAX_RSS_GB (default 14): the machine has 24 GiB, and a
suite that creeps towards it fails for everyone else first.
"""

from __future__ import annotations

import os
import resource
import sys

import pytest
import torch

MAX_RSS_GB = float(os.environ.get("AUGURY_TEST_MAX_RSS_GB", "14"))


def _peak_rss_gb() -> float:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / (1024 * 1024) if sys.platform != "darwin" else kib / 1024**3


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(f"peak memory (RSS) of the test session: {_peak_rss_gb():.2f} GB "
                                f"(bound {MAX_RSS_GB:g} GB, AUGURY_TEST_MAX_RSS_GB)")


def pytest_sessionfinish(session, exitstatus) -> None:
    if _peak_rss_gb() > MAX_RSS_GB and exitstatus == 0:
        session.exitstatus = 1
        print(f"\nthe test session's peak memory {_peak_rss_gb():.2f} GB is over the bound of {MAX_RSS_GB:g} GB",
              file=sys.stderr)


@pytest.fixture(autouse=True)
def _threads(request):
    wanted = 2 if request.node.get_closest_marker("real") else 1
    before = torch.get_num_threads()
    torch.set_num_threads(wanted)
    yield
    torch.set_num_threads(before)
