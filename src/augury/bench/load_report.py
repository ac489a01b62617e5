"""What a load test measured and how it is reported: requests, levels, ratios, goals, mismatches, latency.

The arithmetic behind `augury loadtest`'s tables (see `augury.bench.load` for
how the load is run): tok/s per level, TTFT and TPOT means and percentiles,
the spec-on over spec-off ratio with the spread of its repeats, and texts that
differ from their prompt's concurrency-1 text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from augury.bench.chats import ChatResult, chat_goals, chat_table
from augury.bench.report import Table
from augury.bench.server_process import ServerMemory

SPEC_OFF = "off"
SPEC_ON = "on"
LABELS = {SPEC_OFF: "spec off", SPEC_ON: "spec on"}
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16)
GOAL_RATIO_AT_1 = 1.5  # the issue's goal: speculation at least 1.5x plain for a single client
PERCENTILES = (50, 99)  # of TTFT and TPOT per level, in the latency table


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
    chats: list[ChatResult] = field(default_factory=list)  # multi-turn conversations, each alone (bench.chats)

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
        if self.chats:
            lines.append("")
            lines.append(chat_table(self.chats, LABELS).markdown())
            lines += [f"- {g}" for g in chat_goals(self.chats, LABELS)]
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
            "chats": [chat.to_json() for chat in self.chats],
            "chat_goals": chat_goals(self.chats, LABELS),
        }
