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
    (and both at p50 and p99 per server, in the latency table)

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
from pathlib import Path

from augury.bench.chats import run_chats
from augury.bench.endpoint import EndpointContender
from augury.bench.load_report import LABELS, SPEC_OFF, SPEC_ON, LevelResult, LoadReport, RequestResult
from augury.bench.records import Messages
from augury.bench.server_process import ServerMemory, ServerProcess, check_port_free, free_port, resident_gb, serve_argv
from augury.errors import AuguryError
from augury.sampling import SamplingParams

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
    chat_turns: int = 0,
) -> LoadReport:
    """Every level on every server (alternating which goes first), plus the concurrency-1 references,
    then `chat_turns`-turn conversations on each server alone (`augury.bench.chats`; 0: none).

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
    chats = []
    if chat_turns:
        for name in names:
            done = run_chats(clients[name], name, prompts, chat_turns, max_tokens)
            say(f"{LABELS.get(name, name)}: {len(done)} chats of {chat_turns} turns, TTFT by turn "
                + " ".join(f"{sum(r.ttft_s[t] for r in done) / len(done):.2f}" for t in range(chat_turns)) + " s")
            chats += done
    return LoadReport(levels, references, chats=chats)


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
    chat_turns: int = 0,
    draft_args: Sequence[str] = (),
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
                          repeats, chat_turns)
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
    servers = {s: ServerProcess(LABELS[s], serve_argv(serve_args, ports[s], methods[s], draft_args), ports[s]) for s in ports}
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
                          min_requests, repeats, chat_turns)
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
