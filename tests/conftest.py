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


class _Memory:
    """The session's peak memory, and the tests that raised it, with what was resident after each.

    A peak over the bound names its cause: one test that needs a lot (a large
    rise) or memory that outlives its tests (a resident size that only grows).
    Under pytest-xdist (`make test` runs the tiny-model tests on two workers)
    each worker sends its own peak and rises to the controller, which bounds
    their sum: the workers run at the same time, so the sum is what the
    machine may have to hold.
    """

    def __init__(self) -> None:
        self.rises: list[tuple[float, float, str]] = []  # (rise GB, resident after GB, test id)
        self.worker_peaks: dict[str, float] = {}

    def total_gb(self) -> float:
        return _peak_rss_gb() + sum(self.worker_peaks.values())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        before = _peak_rss_gb()
        yield
        rise = _peak_rss_gb() - before
        if rise > 0.25:
            self.rises.append((rise, _current_rss_gb(), item.nodeid))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:  # controller: a worker finished
        output = getattr(node, "workeroutput", None) or {}
        if "augury_peak_rss_gb" in output:
            self.worker_peaks[node.gateway.id] = output["augury_peak_rss_gb"]
            self.rises.extend(tuple(rise) for rise in output["augury_rises"])

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # a worker: the controller judges the sum
            workeroutput["augury_peak_rss_gb"] = _peak_rss_gb()
            workeroutput["augury_rises"] = [list(rise) for rise in self.rises]
            return
        if self.total_gb() > MAX_RSS_GB and exitstatus == 0:
            session.exitstatus = 1
            print(f"\nthe test session's peak memory {self.total_gb():.2f} GB is over the bound of {MAX_RSS_GB:g} GB",
                  file=sys.stderr)


def pytest_configure(config) -> None:
    config.pluginmanager.register(_Memory(), "augury-memory")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """On a pytest-xdist worker, slow tests first. Under `--dist worksteal` each worker starts on its half
    of this order and an idle one takes the tail of the other's queue: the longest tests start first,
    and the quick ones, last, are what moves between workers at the end."""
    if getattr(config, "workerinput", None) is None:
        return
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") else 1)  # stable: modules keep their order


def pytest_terminal_summary(terminalreporter) -> None:
    memory = terminalreporter.config.pluginmanager.get_plugin("augury-memory")
    workers = "".join(f", worker {name} {gb:.2f} GB" for name, gb in sorted(memory.worker_peaks.items()))
    terminalreporter.write_line(f"peak memory (RSS) of the test session: {memory.total_gb():.2f} GB "
                                f"(bound {MAX_RSS_GB:g} GB, AUGURY_TEST_MAX_RSS_GB{workers})")
    for rise, resident, nodeid in sorted(memory.rises, reverse=True)[:6]:
        terminalreporter.write_line(f"  raised the peak {rise:.2f} GB (resident after: {resident:.2f} GB): {nodeid}")


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
