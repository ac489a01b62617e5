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


def _current_rss_gb() -> float:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024**3
    except OSError:
        return float("nan")


class _PeakRaisers:
    """The tests that raised the session's peak memory, with what was resident after each.

    A peak over the bound names its cause: one test that needs a lot (a large
    rise) or memory that outlives its tests (a resident size that only grows).
    """

    def __init__(self) -> None:
        self.rises: list[tuple[float, float, str]] = []  # (rise GB, resident after GB, test id)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        before = _peak_rss_gb()
        yield
        rise = _peak_rss_gb() - before
        if rise > 0.25:
            self.rises.append((rise, _current_rss_gb(), item.nodeid))


def pytest_configure(config) -> None:
    config.pluginmanager.register(_PeakRaisers(), "augury-peak-raisers")


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(f"peak memory (RSS) of the test session: {_peak_rss_gb():.2f} GB "
                                f"(bound {MAX_RSS_GB:g} GB, AUGURY_TEST_MAX_RSS_GB)")
    raisers = terminalreporter.config.pluginmanager.get_plugin("augury-peak-raisers")
    for rise, resident, nodeid in sorted(raisers.rises, reverse=True)[:6]:
        terminalreporter.write_line(f"  raised the peak {rise:.2f} GB (resident after: {resident:.2f} GB): {nodeid}")


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


@pytest.fixture()
def home(tmp_path, monkeypatch):
    """A private AUGURY_HOME (models, heads, caches) under the test's tmp_path, which it returns."""
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path / "home"))
    return tmp_path
