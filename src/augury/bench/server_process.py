"""One `augury serve` subprocess as a load test runs it: started, waited for, measured, stopped.

`bench.load` runs two of these side by side (speculation off and on); what it
needs of a server process is here: a free port, the command line, readiness on
/health, the resident memory from /proc, and a stop that always happens.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from augury.errors import AuguryError

STDERR_TAIL_LINES = 4


@dataclass
class ServerMemory:
    """A server's resident memory in GB: when it was ready, its peak, and once the load had ended."""

    ready: float
    peak: float
    after: float

    def describe(self) -> str:
        return (f"{self.ready:.2f} GB resident when ready, peak {self.peak:.2f} GB, "
                f"{self.after:.2f} GB after the load ({self.after - self.ready:+.2f} GB)")


def resident_gb(pid: int) -> tuple[float, float] | None:
    """(current, peak) resident set of a process in GB from /proc (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:
        return None
    kib = [int(fields[name].split()[0]) for name in ("VmRSS", "VmHWM") if name in fields]
    return (kib[0] / 1024**2, kib[1] / 1024**2) if len(kib) == 2 else None


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise AuguryError(f"port {port} on {host} is in use ({exc.strerror})") from None


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port the OS considers free right now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server subprocess: started, waited for on /health, stopped (terminate, then kill).

    Its stderr goes to a temporary file rather than a pipe, so a chatty server
    can never block on a full pipe, and the tail is there to show if it fails.
    """

    def __init__(self, label: str, argv: list[str], port: int, host: str = "127.0.0.1") -> None:
        self.label = label
        self.argv = argv
        self.base = f"http://{host}:{port}"
        self.proc: subprocess.Popen | None = None
        self._stderr = None

    def start(self) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        # A session of its own: Ctrl-C reaches only this process, which then stops the server in order.
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._stderr, start_new_session=True)

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", errors="replace")
        kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(kept) if kept else "(nothing on stderr)"

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_ready(self, timeout: float) -> None:
        """Return once /health answers; AuguryError (with the stderr tail) if it exits or takes too long."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise AuguryError(f"the {self.label} server exited with code {code} before it was ready; "
                                  f"its stderr ends: {self.stderr_tail()}")
            if self._healthy():
                return
            if time.monotonic() > deadline:
                raise AuguryError(f"the {self.label} server did not answer {self.base}/health within {timeout:g}s; "
                                  f"its stderr ends: {self.stderr_tail()}")
            time.sleep(0.25)

    def stop(self, grace: float = 15.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def serve_argv(serve_args: list[str], port: int, draft_method: str, draft_args: Sequence[str] = ()) -> list[str]:
    """The command line of one `augury serve` subprocess (this interpreter, this augury). draft_args (--k,
    --draft) go to a drafting server only: plain decoding refuses drafting options."""
    drafting = list(draft_args) if draft_method != "plain" else []
    return [sys.executable, "-m", "augury.cli", "serve", *serve_args, *drafting, "--draft-method", draft_method,
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--queue-timeout", "0"]
