"""Load test: output tokens/s against concurrency, speculation on and off, in one run.

Two `augury serve` processes run side by side on 127.0.0.1, one drafting with
a model and one decoding plainly, and any other OpenAI-compatible server given
as an endpoint (llama-server with `-np N -cb` on the same GGUF), but only one
of them is under load at a time: an idle server's engine thread sleeps on a condition variable, so on a
2-core machine the measured server has the cores to itself, and neither pays
for the other. Keeping both alive (rather than restarting one per level) means
each level runs on warm processes with the scheduler's cost model already fitted.
The order alternates per concurrency level (off then on, then on then off, ...)
so slow drift of the machine (other jobs, heat) hits both sides alike. With
`repeats` R > 1 each level runs R times per server, the order turning at each
repeat (off on on off ...): drift that is linear over a level then cancels, and
the spread of the R per-repeat ratios shows how far the machine's noise
reaches; a level's numbers sum all its repeats.

A level with concurrency c starts c client threads at once (a barrier), each
sending `requests_per_client` streaming chat completions one after another, or
more where the level would otherwise send fewer than `min_requests` in all:
a level of one client sending two requests measured two prompts, and speed-ups
differ between prompts far more than between runs. Request r of client w asks
prompt (r * c + w) mod P, so the prompts go round robin over all clients.
Measured per level and server:

    tok/s = completion tokens of all its requests / wall time of the level
    TTFT  = mean wait from sending a request to its first content delta
    TPOT  = mean of (request time - TTFT) / (tokens - 1), per request

Tokens are the server's usage report (`stream_options.include_usage`); the
streaming client is the same one `augury bench --endpoint` uses.

At temperature 0 batching must not change a single token, so every response is
compared with the text its prompt got at concurrency 1 on the same server.
Prompts that the concurrency-1 level does not send get one request each,
alone, before the levels (which doubles as warm-up). Speculation is lossless,
so the concurrency-1 texts of the two servers are compared with each other too.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from augury.bench.endpoint import EndpointContender
from augury.bench.records import Messages
from augury.bench.report import Table
from augury.bench.server_process import ServerMemory, ServerProcess, check_port_free, free_port, resident_gb, serve_argv
from augury.errors import AuguryError
from augury.sampling import SamplingParams

SPEC_OFF = "off"
SPEC_ON = "on"
LABELS = {SPEC_OFF: "spec off", SPEC_ON: "spec on"}
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
GOAL_RATIO_AT_1 = 1.5  # the issue's goal: speculation at least 1.5x plain for a single client
PERCENTILES = (50, 99)  # of TTFT and TPOT per level, in the latency table


# -- input ------------------------------------------------------------------------------------------


def parse_concurrency(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: positive, distinct integers, kept in the given order."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p.isdigit() for p in parts):
        raise AuguryError(f"--concurrency must be a comma list of positive integers like 1,2,4,8,16, got '{text}'")
    levels = [int(p) for p in parts]
    if min(levels) < 1:
        raise AuguryError(f"--concurrency levels must be at least 1, got '{text}'")
    if len(set(levels)) != len(levels):
        raise AuguryError(f"--concurrency lists a level twice: '{text}'")
    return levels


def prompt_index(client: int, round_: int, concurrency: int, n_prompts: int) -> int:
    """The prompt that client `client` sends in its round `round_` (round robin over all clients)."""
    return (round_ * concurrency + client) % n_prompts


def rounds_at(concurrency: int, requests_per_client: int, min_requests: int = 0) -> int:
    """Requests each client sends at a level: requests_per_client, or more to reach min_requests in all."""
    return max(requests_per_client, -(-min_requests // concurrency))


def prompts_at(concurrency: int, rounds: int, n_prompts: int) -> set[int]:
    return {prompt_index(w, r, concurrency, n_prompts) for w in range(concurrency) for r in range(rounds)}


# -- results ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestResult:
    """One streamed completion as the client saw it."""

    prompt: int  # index into the prompt list
    text: str
    tokens: int  # completion tokens (the server's usage report)
    ttft_s: float  # request sent -> first content delta
    total_s: float  # request sent -> stream ended

    @property
    def tpot_s(self) -> float | None:
        """Seconds per output token after the first (None for a one-token answer)."""
        return (self.total_s - self.ttft_s) / (self.tokens - 1) if self.tokens > 1 else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by nearest rank: a value some request really saw, not an interpolation."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100), at least the first
    return ordered[int(rank) - 1]


@dataclass
class LevelResult:
    """All requests one server answered at one concurrency level, and the level's wall time."""

    server: str  # SPEC_OFF or SPEC_ON
    concurrency: int
    wall_s: float
    requests: list[RequestResult]
    repeat: int = 0  # which repeat of the level this was (run_load's `repeats`); -1: several summed

    @classmethod
    def merged(cls, runs: Sequence["LevelResult"]) -> "LevelResult":
        """Several repeats of one level as one: their wall times and requests summed."""
        first = runs[0]
        if len(runs) == 1:
            return first
        return cls(first.server, first.concurrency, sum(r.wall_s for r in runs),
                   [req for r in runs for req in r.requests], repeat=-1)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests)

    @property
    def tok_s(self) -> float:
        """Aggregate output tokens/s: every client's tokens over the level's wall time."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def ttft_s(self) -> float | None:
        return _mean([r.ttft_s for r in self.requests])

    @property
    def tpot_s(self) -> float | None:
        return _mean([r.tpot_s for r in self.requests if r.tpot_s is not None])

    def ttft_pct(self, q: float) -> float | None:
        return percentile([r.ttft_s for r in self.requests], q)

    def tpot_pct(self, q: float) -> float | None:
        return percentile([r.tpot_s for r in self.requests if r.tpot_s is not None], q)

    def to_json(self) -> dict:
        return {
            "concurrency": self.concurrency,
            "requests": len(self.requests),
            "completion_tokens": self.tokens,
            "wall_s": self.wall_s,
            "tok_s": self.tok_s,
            "ttft_mean_s": self.ttft_s,
            "tpot_mean_s": self.tpot_s,
            **{f"ttft_p{q}_s": self.ttft_pct(q) for q in PERCENTILES},
            **{f"tpot_p{q}_s": self.tpot_pct(q) for q in PERCENTILES},
        }


@dataclass(frozen=True)
class Mismatch:
    """A response whose text differs from the reference text of the same prompt."""

    server: str
    concurrency: int | None  # None: the two servers' concurrency-1 texts (spec on vs off)
    prompt: int
    expected: str
    got: str

    def describe(self, prompt_ids: Sequence[str] | None = None) -> str:
        name = prompt_ids[self.prompt] if prompt_ids else str(self.prompt)
        where = (
            "spec on vs spec off at concurrency 1"
            if self.concurrency is None
            else f"{LABELS.get(self.server, self.server)} at concurrency {self.concurrency} vs concurrency 1"
        )
        n = next((i for i, (a, b) in enumerate(zip(self.expected, self.got)) if a != b),
                 min(len(self.expected), len(self.got)))
        return f"prompt {name}, {where}: texts differ from character {n}: {self.got[n:n + 30]!r} instead of " \
               f"{self.expected[n:n + 30]!r}"


@dataclass
class LoadReport:
    levels: list[LevelResult]  # every run, in the order they ran (repeats of a level included)
    references: dict[str, dict[int, str]]  # server -> prompt -> its text at concurrency 1
    prompt_ids: list[str] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    memory: dict[str, ServerMemory] = field(default_factory=dict)  # server -> its resident sizes

    def runs(self, server: str, concurrency: int) -> list[LevelResult]:
        """The repeats of one level on one server, in the order they ran."""
        return [lv for lv in self.levels if lv.server == server and lv.concurrency == concurrency]

    def level(self, server: str, concurrency: int) -> LevelResult | None:
        """One level on one server, all its repeats summed."""
        runs = self.runs(server, concurrency)
        return LevelResult.merged(runs) if runs else None

    def repeat_ratios(self, concurrency: int) -> list[float]:
        """Spec-on over spec-off tokens/s per repeat of a level (the spread shows the noise)."""
        pairs = zip(self.runs(SPEC_ON, concurrency), self.runs(SPEC_OFF, concurrency))
        return [on.tok_s / off.tok_s for on, off in pairs if off.tok_s > 0]

    @property
    def concurrencies(self) -> list[int]:
        return list(dict.fromkeys(lv.concurrency for lv in self.levels))

    @property
    def servers(self) -> list[str]:
        """Every server that was loaded (spec off, spec on, any endpoint), in the order first run."""
        return list(dict.fromkeys(lv.server for lv in self.levels))

    def latency_table(self) -> Table:
        """Per server and level: tokens/s, and TTFT and TPOT at the median and the 99th percentile."""
        def f(value: float | None, spec: str, scale: float = 1.0) -> str:
            return "—" if value is None else f"{value * scale:{spec}}"

        rows = []
        for server in self.servers:
            for c in self.concurrencies:
                lv = self.level(server, c)
                if lv is None:
                    continue
                rows.append([LABELS.get(server, server), str(c), f(lv.tok_s, ".1f"),
                             *(f(lv.ttft_pct(q), ".2f") for q in PERCENTILES),
                             *(f(lv.tpot_pct(q), ".1f", 1000) for q in PERCENTILES)])
        headers = ["server", "concurrency", "tok/s", *(f"TTFT p{q} (s)" for q in PERCENTILES),
                   *(f"TPOT p{q} (ms)" for q in PERCENTILES)]
        return Table("Latency by server and concurrency", headers, rows)

    def ratio(self, concurrency: int) -> float | None:
        """Spec-on tokens/s over spec-off tokens/s at one level."""
        on, off = self.level(SPEC_ON, concurrency), self.level(SPEC_OFF, concurrency)
        if on is None or off is None or off.tok_s == 0:
            return None
        return on.tok_s / off.tok_s

    def mismatches(self) -> list[Mismatch]:
        """Responses that differ from their prompt's concurrency-1 text on the same server."""
        found = []
        for lv in self.levels:
            for r in lv.requests:
                expected = self.references.get(lv.server, {}).get(r.prompt)
                if expected is not None and r.text != expected:
                    found.append(Mismatch(lv.server, lv.concurrency, r.prompt, expected, r.text))
        return found

    def lossless_mismatches(self) -> list[Mismatch]:
        """Prompts whose concurrency-1 text with speculation differs from plain decoding's."""
        off, on = self.references.get(SPEC_OFF, {}), self.references.get(SPEC_ON, {})
        return [Mismatch(SPEC_ON, None, p, off[p], on[p]) for p in sorted(off.keys() & on.keys()) if off[p] != on[p]]

    def compared(self) -> int:
        return sum(1 for lv in self.levels for r in lv.requests if r.prompt in self.references.get(lv.server, {}))

    def table(self) -> Table:
        def f(value: float | None, spec: str, scale: float = 1.0) -> str:
            return "—" if value is None else f"{value * scale:{spec}}"

        rows = []
        for c in self.concurrencies:
            off, on = self.level(SPEC_OFF, c), self.level(SPEC_ON, c)
            ratio = self.ratio(c)
            spread = self.repeat_ratios(c)
            shown = "—" if ratio is None else f"{ratio:.2f}x"
            if ratio is not None and len(spread) > 1:
                shown += f" ({min(spread):.2f}-{max(spread):.2f})"
            rows.append([
                str(c),
                f(off and off.tok_s, ".1f"),
                f(on and on.tok_s, ".1f"),
                shown,
                f"{f(off and off.ttft_s, '.2f')} / {f(on and on.ttft_s, '.2f')}",
                f"{f(off and off.tpot_s, '.1f', 1000)} / {f(on and on.tpot_s, '.1f', 1000)}",
            ])
        headers = ["concurrency", "spec off tok/s", "spec on tok/s", "ratio (repeats' range)", "TTFT off / on (s)",
                   "TPOT off / on (ms)"]
        return Table("Output tokens/s against concurrency", headers, rows)

    def goals(self) -> list[str]:
        """The issue's two goals, each as met / missed with the numbers behind it."""
        lines = []
        at_1 = self.ratio(1)
        if at_1 is not None:
            verdict = "met" if at_1 >= GOAL_RATIO_AT_1 else "missed"
            lines.append(f"goal: at least {GOAL_RATIO_AT_1}x at concurrency 1: {verdict} ({at_1:.2f}x)")
        ratios = {c: r for c in self.concurrencies if (r := self.ratio(c)) is not None}
        slower = [f"{c} ({r:.2f}x{self._noise_note(c)})" for c, r in ratios.items() if r < 1.0]
        if ratios:
            verdict = "met" if not slower else "missed at concurrency " + ", ".join(slower)
            lines.append(f"goal: never slower than speculation off: {verdict}")
        return lines

    def _noise_note(self, concurrency: int) -> str:
        """For a level measured slower: whether some repeat was not (the difference is within the noise)."""
        spread = self.repeat_ratios(concurrency)
        if len(spread) > 1 and max(spread) >= 1.0:
            return f"; repeats {min(spread):.3f}-{max(spread):.3f}, one not slower: within this machine's noise"
        return ""

    def markdown(self) -> str:
        lines = [self.table().markdown()] if {SPEC_OFF, SPEC_ON} & set(self.servers) else []
        lines.append(self.latency_table().markdown())
        lines += [f"- {g}" for g in self.goals()]
        mismatches = self.mismatches()
        if mismatches:
            lines.append(f"- outputs: {len(mismatches)} of {self.compared()} responses differ from their prompt's "
                         "concurrency-1 text:")
            lines += [f"  - {m.describe(self.prompt_ids)}" for m in mismatches]
        else:
            lines.append(f"- outputs: all {self.compared()} responses equal their prompt's concurrency-1 text")
        lossless = self.lossless_mismatches()
        both = len(self.references.get(SPEC_OFF, {}).keys() & self.references.get(SPEC_ON, {}).keys())
        if lossless:
            lines.append(f"- lossless: spec on differs from spec off on {len(lossless)} of {both} prompts:")
            lines += [f"  - {m.describe(self.prompt_ids)}" for m in lossless]
        elif both:
            lines.append(f"- lossless: spec on equals spec off on all {both} prompts")
        for server, memory in self.memory.items():
            lines.append(f"- memory of the {LABELS.get(server, server)} server: {memory.describe()}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict:
        return {
            "settings": self.settings,
            "levels": [
                {
                    "concurrency": c,
                    "ratio": self.ratio(c),
                    "repeat_ratios": self.repeat_ratios(c),
                    **{s: lv.to_json() for s in self.servers if (lv := self.level(s, c)) is not None},
                }
                for c in self.concurrencies
            ],
            "goals": self.goals(),
            "responses_compared": self.compared(),
            "mismatches": [asdict(m) for m in self.mismatches()],
            "lossless_mismatches": [asdict(m) for m in self.lossless_mismatches()],
            "memory_gb": {server: asdict(memory) for server, memory in self.memory.items()},
        }


# -- the client side --------------------------------------------------------------------------------


def stream_one(client: EndpointContender, messages: Messages, prompt: int, max_tokens: int) -> RequestResult:
    """One greedy streaming chat completion, timed by the client."""
    outcome = client.generate(messages, None, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    s = outcome.stats
    return RequestResult(prompt=prompt, text=outcome.text, tokens=s.generated_tokens, ttft_s=s.prefill_s,
                         total_s=s.total_s)


def run_level(
    client: EndpointContender,
    server: str,
    prompts: Sequence[Messages],
    concurrency: int,
    requests_per_client: int,
    max_tokens: int,
) -> LevelResult:
    """`concurrency` client threads released together, each sending its requests one after another."""
    results: list[list[RequestResult]] = [[] for _ in range(concurrency)]
    errors: list[BaseException] = []
    finished = [0.0] * concurrency
    barrier = threading.Barrier(concurrency + 1)

    def worker(w: int) -> None:
        try:
            barrier.wait()
            for r in range(requests_per_client):
                i = prompt_index(w, r, concurrency, len(prompts))
                results[w].append(stream_one(client, prompts[i], i, max_tokens))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            finished[w] = time.perf_counter()

    # Daemon threads: on Ctrl-C the main thread stops the servers, which ends their streams.
    threads = [threading.Thread(target=worker, args=(w,), daemon=True, name=f"loadtest-{w}")
               for w in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        error = errors[0]
        if isinstance(error, AuguryError):
            raise AuguryError(f"{LABELS.get(server, server)} at concurrency {concurrency}: {error}") from None
        raise error
    return LevelResult(server, concurrency, max(finished) - t0, [r for part in results for r in part])


def run_load(
    clients: dict[str, EndpointContender],
    prompts: Sequence[Messages],
    concurrency: Sequence[int],
    requests_per_client: int,
    max_tokens: int,
    progress: Callable[[str], None] | None = None,
    min_requests: int = 0,
    repeats: int = 1,
) -> LoadReport:
    """Every level on every server (alternating which goes first), plus the concurrency-1 references.

    `clients` maps SPEC_OFF / SPEC_ON (or any names) to a checked endpoint client.
    """
    say = progress or (lambda _line: None)
    names = list(clients)
    n = len(prompts)
    rounds = {c: rounds_at(c, requests_per_client, min_requests) for c in concurrency}
    used = set().union(*(prompts_at(c, rounds[c], n) for c in concurrency))
    alone = prompts_at(1, rounds[1], n) if 1 in concurrency else set()
    references: dict[str, dict[int, str]] = {name: {} for name in names}
    for name in names:
        if not used - alone:  # nothing to send alone first: one request warms the server up
            stream_one(clients[name], prompts[0], 0, max_tokens)
        for i in sorted(used - alone):
            references[name][i] = stream_one(clients[name], prompts[i], i, max_tokens).text
        if used - alone:
            say(f"{LABELS.get(name, name)}: {len(used - alone)} prompt(s) the concurrency-1 level does not ask, "
                "sent alone first as references (and warm-up)")
    levels = []
    for step, c in enumerate(concurrency):
        for repeat in range(repeats):
            order = names if (step + repeat) % 2 == 0 else names[::-1]
            for name in order:
                level = run_level(clients[name], name, prompts, c, rounds[c], max_tokens)
                level.repeat = repeat
                levels.append(level)
                if c == 1:
                    for r in level.requests:
                        references[name].setdefault(r.prompt, r.text)
                which = f" (repeat {repeat + 1} of {repeats})" if repeats > 1 else ""
                say(f"{LABELS.get(name, name)}, concurrency {c}{which}: {level.tok_s:.1f} tok/s "
                    f"({level.tokens} tokens in {level.wall_s:.1f}s)")
    return LoadReport(levels, references)


# -- the servers ------------------------------------------------------------------------------------


def run_with_servers(
    serve_args: list[str],
    prompts: Sequence[Messages],
    concurrency: Sequence[int],
    requests_per_client: int,
    max_tokens: int,
    port: int = 0,
    startup_timeout: float = 600.0,
    progress: Callable[[str], None] | None = None,
    min_requests: int = 0,
    repeats: int = 1,
    endpoints: dict[str, EndpointContender] | None = None,
    endpoint_pids: dict[str, int] | None = None,
    start_augury: bool = True,
) -> LoadReport:
    """Start the spec-off and spec-on servers, run the load, and stop both whatever happens.

    port 0: ephemeral ports; otherwise spec off gets `port` and spec on `port + 1`.
    endpoints: other servers already running (llama-server, vLLM, ...) by name, loaded with the same
    prompts and levels in the same run, their resident memory read from `endpoint_pids` where given;
    start_augury False loads only those.
    """
    say = progress or (lambda _line: None)
    endpoints = endpoints or {}
    endpoint_pids = endpoint_pids or {}
    if not start_augury:
        ready = {name: resident_gb(pid) for name, pid in endpoint_pids.items()}
        report = run_load(endpoints, prompts, concurrency, requests_per_client, max_tokens, progress, min_requests,
                          repeats)
        _record_memory(report, ready, endpoint_pids)
        return report
    if port:
        for p in (port, port + 1):
            check_port_free(p)
        ports = {SPEC_OFF: port, SPEC_ON: port + 1}
    else:
        first = free_port()
        second = free_port()
        while second == first:
            second = free_port()
        ports = {SPEC_OFF: first, SPEC_ON: second}
    methods = {SPEC_OFF: "plain", SPEC_ON: "model"}
    servers = {s: ServerProcess(LABELS[s], serve_argv(serve_args, ports[s], methods[s]), ports[s]) for s in ports}
    try:
        for server in servers.values():  # both load their models at once
            server.start()
        for name, server in servers.items():
            server.wait_ready(startup_timeout)
            say(f"{LABELS[name]} server ready at {server.base}")
        clients = {}
        for name, server in servers.items():
            clients[name] = EndpointContender(server.base, method=name)
            clients[name].check()
        pids = {name: server.proc.pid for name, server in servers.items()} | endpoint_pids
        ready = {name: resident_gb(pid) for name, pid in pids.items()}
        report = run_load(clients | endpoints, prompts, concurrency, requests_per_client, max_tokens, progress,
                          min_requests, repeats)
        _record_memory(report, ready, pids)
        return report
    finally:
        for server in servers.values():
            try:
                server.stop()
            except BaseException:  # still stop the other one, even on a second Ctrl-C
                if server.proc is not None:
                    server.proc.kill()


def _record_memory(report: LoadReport, ready: dict[str, tuple[float, float] | None], pids: dict[str, int]) -> None:
    """Each server's resident memory when ready, at its peak and after the load (where /proc shows it)."""
    for name, pid in pids.items():
        after = resident_gb(pid)
        if ready.get(name) is not None and after is not None:
            report.memory[name] = ServerMemory(ready=ready[name][0], peak=after[1], after=after[0])


def write_json(report: LoadReport, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise AuguryError(f"cannot write {path}: {exc.strerror or exc}") from None
