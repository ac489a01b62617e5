"""Aggregate benchmark records into per-task and overall numbers.

Definitions (also printed under the report's tables):

* tokens/s of a method over a set of prompts = Σ generated tokens / Σ decode
  seconds, where decode seconds are a generation's wall time after its first
  token (prompt prefill and the first token excluded, as in `SpecStats`). It is
  a ratio of sums, so long generations weigh more than short ones, exactly as
  they do in wall-clock time.
* speed-up of a method = its tokens/s ÷ plain decoding's tokens/s, both over
  the prompts that *both* finished in this same run (same process, same
  machine state, interleaved). A per-task speed-up uses that task's prompts;
  the overall one all prompts, so it is not the mean of the task speed-ups.
  The end-to-end speed-up is the same ratio with whole wall time (prefill
  included) in place of decode time.
* τ, α and acceptance by position are `metrics.SpecStats`'s, over the
  records' counters summed (so over a set of prompts they are ratios of sums);
  a method that reports no verification steps or drafts (a peer, an endpoint)
  shows none rather than 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from augury.bench.records import record_stats
from augury.metrics import SpecStats

OVERALL = "overall"
PLAIN = "plain"

Key = tuple[str, int]  # (method, k)


@dataclass
class Aggregate:
    """A method's records over a set of prompts: their `SpecStats` summed, and what only records hold."""

    stats: SpecStats = field(default_factory=SpecStats)
    runs: int = 0
    turns: int = 0
    # Decode seconds as recorded: each run's wall time after its first token, 0 for a run that generated
    # no token (so such a run adds nothing to tokens/s either way).
    seconds: float = 0.0
    speedup: float | None = None
    speedup_e2e: float | None = None
    slowest: float | None = None  # the lowest per-prompt decode speed-up over plain among its prompts

    def add(self, record: dict) -> None:
        self.runs += 1
        self.turns += record.get("turns", 0)
        self.seconds += record.get("seconds", 0.0)
        self.stats = self.stats.merge(record_stats(record))

    @property
    def tokens_per_s(self) -> float:
        return self.stats.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s_e2e(self) -> float:
        return self.stats.generated_tokens / self.stats.total_s if self.stats.total_s > 0 else 0.0

    @property
    def tau(self) -> float | None:
        """`SpecStats.tau`; None (not 0) when the method reports no verification steps (peers, endpoints)."""
        return self.stats.tau if self.stats.steps else None

    @property
    def alpha(self) -> float | None:
        """`SpecStats.alpha`; None (not 0) when nothing was drafted."""
        return self.stats.alpha if self.stats.drafted else None

    @property
    def acceptance_by_position(self) -> list[float]:
        return self.stats.acceptance_by_position

    @property
    def ttft_s(self) -> float:
        """Mean time to first token per turn (prefill plus the first token)."""
        return self.stats.prefill_s / self.turns if self.turns else 0.0

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first."""
        return self.seconds / self.stats.generated_tokens if self.stats.generated_tokens else 0.0


def aggregate(records: list[dict]) -> Aggregate:
    agg = Aggregate()
    for record in records:
        agg.add(record)
    return agg


@dataclass(frozen=True)
class Mismatch:
    """A greedy output that left plain decoding's: where, and the two tokens there."""

    prompt_id: str
    method: str
    k: int
    turn: int
    position: int  # first differing output position (or the shorter length)
    token: int | None
    plain_token: int | None


@dataclass(frozen=True)
class PeerComparison:
    """augury against one peer; each ratio is augury's tokens/s ÷ the peer's over the prompts both ran."""

    peer: str
    peer_tokens_per_s: float  # over all the peer's prompts
    peer_tokens_per_s_e2e: float  # the same with whole wall time (prefill included)
    counterpart: str | None  # the augury method doing the same thing (plain for hf, model for hf-assisted, ...)
    counterpart_ratio: float | None
    counterpart_ratio_e2e: float | None  # the same with whole wall time (prefill included)
    best: str  # augury's fastest method against this peer
    best_ratio: float | None


@dataclass
class Summary:
    info: dict
    keys: list[Key]
    labels: dict[Key, str]
    kinds: dict[Key, str]
    tasks: list[str]
    cells: dict[tuple[str, Key], Aggregate]
    finished: int
    expected: int
    greedy: bool
    compared: dict[Key, tuple[int, int]]  # key -> (identical, compared) against plain
    mismatches: list[Mismatch]
    peers: list[PeerComparison]
    sweep: dict[str, list[tuple[int, float | None, float | None]]]  # method -> [(k, speed-up, tau)]

    @property
    def complete(self) -> bool:
        return self.finished >= self.expected

    @property
    def status(self) -> str:
        return "complete" if self.complete else f"INCOMPLETE: {self.finished} of {self.expected} runs"

    def cell(self, task: str, key: Key) -> Aggregate | None:
        return self.cells.get((task, key))


def _plain_of(key: Key, keys: list[Key], kinds: dict[Key, str]) -> Key | None:
    """The plain run on the same weights as `key` ("plain@bf16" for "model@bf16"), if the run has one."""
    _, at, weights = key[0].partition("@")
    wanted = f"{PLAIN}@{weights}" if at else PLAIN
    return next((k for k in keys if k[0] == wanted and kinds[k] == "augury"), None)


def first_difference(ours: list[int], plain: list[int]) -> int | None:
    """The first output position where two token lists differ (None if equal)."""
    for i, (a, b) in enumerate(zip(ours, plain)):
        if a != b:
            return i
    return None if len(ours) == len(plain) else min(len(ours), len(plain))


def _rate(by_prompt: dict[str, dict], prompts: set[str], e2e: bool = False) -> float:
    agg = aggregate([by_prompt[p] for p in prompts])
    return agg.tokens_per_s_e2e if e2e else agg.tokens_per_s


def summarize(records: list[dict], info: dict) -> Summary:
    """All numbers of the report, from the records and the run's settings (run.json)."""
    methods = info.get("methods") or []
    keys: list[Key] = [(m["method"], int(m["k"])) for m in methods]
    for record in records:  # records of methods not in run.json (should not happen) still count
        key = (record["method"], int(record["k"]))
        if key not in keys:
            keys.append(key)
    meta = {(m["method"], int(m["k"])): m for m in methods}
    kinds = {key: meta.get(key, {}).get("kind", "augury") for key in keys}
    ks: dict[str, set[int]] = {}
    for method, k in keys:
        ks.setdefault(method, set()).add(k)
    labels = {(m, k): (f"{m} k={k}" if len(ks[m]) > 1 else m) for m, k in keys}

    tasks = list(dict.fromkeys(r["task"] for r in records))
    by_key: dict[Key, dict[str, dict]] = {key: {} for key in keys}
    for record in records:
        by_key[(record["method"], int(record["k"]))][str(record["prompt_id"])] = record
    plain_key = next((key for key in keys if key[0] == PLAIN and kinds[key] == "augury"), None)
    plain = by_key.get(plain_key, {}) if plain_key else {}

    cells: dict[tuple[str, Key], Aggregate] = {}
    for task in [*tasks, OVERALL]:
        for key in keys:
            mine = {p: r for p, r in by_key[key].items() if task == OVERALL or r["task"] == task}
            if not mine:
                continue
            agg = aggregate(list(mine.values()))
            common = [p for p in mine if p in plain]
            if plain_key is not None and common:
                ours, base = aggregate([mine[p] for p in common]), aggregate([plain[p] for p in common])
                if base.tokens_per_s > 0:
                    agg.speedup = ours.tokens_per_s / base.tokens_per_s
                if base.tokens_per_s_e2e > 0:
                    agg.speedup_e2e = ours.tokens_per_s_e2e / base.tokens_per_s_e2e
                ratios = [aggregate([mine[p]]).tokens_per_s / aggregate([plain[p]]).tokens_per_s for p in common
                          if aggregate([plain[p]]).tokens_per_s > 0]
                agg.slowest = min(ratios) if ratios else None
            cells[(task, key)] = agg

    # Greedy and coupled (seeded) sampling give plain decoding's very tokens: those runs are compared.
    greedy = float(info.get("temperature", 0.0)) == 0.0 or info.get("sampling") == "coupled"
    compared: dict[Key, tuple[int, int]] = {}
    mismatches: list[Mismatch] = []
    if greedy and plain_key is not None:
        for key in keys:
            # "model@bf16" is compared with "plain@bf16" where that ran: speculation is lossless
            # against plain decoding on the same weights; other weights round differently.
            # plain@bf16 itself is compared with the default plain: how far the two weights agree.
            own_plain = _plain_of(key, keys, kinds) or plain_key
            own_plain = plain_key if own_plain == key else own_plain
            if key == own_plain or kinds[key] == "endpoint":
                continue
            base_records = by_key[own_plain]
            same = total = 0
            for pid, record in by_key[key].items():
                if pid not in base_records:
                    continue
                total += 1
                ok = True
                for turn, (ours, base) in enumerate(zip(record["token_ids"], base_records[pid]["token_ids"])):
                    pos = first_difference(ours, base)
                    if pos is not None:
                        ok = False
                        mismatches.append(
                            Mismatch(
                                pid, key[0], key[1], turn, pos,
                                ours[pos] if pos < len(ours) else None,
                                base[pos] if pos < len(base) else None,
                            )
                        )
                        break
                same += ok
            if total:
                compared[key] = (same, total)

    peers = _compare_peers(keys, kinds, labels, meta, by_key)
    sweep: dict[str, list[tuple[int, float | None, float | None]]] = {}
    for method, method_ks in ks.items():
        if len(method_ks) > 1:
            points = []
            for k in sorted(method_ks):
                agg = cells.get((OVERALL, (method, k)))
                if agg is not None:
                    points.append((k, agg.speedup, agg.tau))
            sweep[method] = points

    return Summary(
        info=info,
        keys=keys,
        labels=labels,
        kinds=kinds,
        tasks=tasks,
        cells=cells,
        finished=len(records),
        expected=int(info.get("expected_runs", len(records))),
        greedy=greedy,
        compared=compared,
        mismatches=mismatches,
        peers=peers,
        sweep=sweep,
    )


def _ratio(ours: dict[str, dict], theirs: dict[str, dict], e2e: bool = False) -> float | None:
    """augury's tokens/s ÷ the peer's, over the prompts both have records for."""
    common = set(ours) & set(theirs)
    if not common:
        return None
    peer_rate = _rate(theirs, common, e2e)
    return _rate(ours, common, e2e) / peer_rate if peer_rate > 0 else None


def _compare_peers(keys, kinds, labels, meta, by_key) -> list[PeerComparison]:
    """augury against each peer: its counterpart method (at the peer's K if swept) and its fastest."""
    ours = [key for key in keys if kinds[key] == "augury" and by_key[key]]
    out = []
    for key in keys:
        theirs = by_key[key]
        if kinds[key] == "augury" or not theirs or not ours:
            continue
        name = meta.get(key, {}).get("counterpart")
        candidates = [o for o in ours if o[0] == name]
        counterpart = next((o for o in candidates if o[1] in (key[1], 0)), candidates[0] if candidates else None)
        ratios = {o: _ratio(by_key[o], theirs) for o in ours}
        best = max(ratios, key=lambda o: ratios[o] or 0.0)
        out.append(
            PeerComparison(
                peer=labels[key],
                peer_tokens_per_s=aggregate(list(theirs.values())).tokens_per_s,
                peer_tokens_per_s_e2e=aggregate(list(theirs.values())).tokens_per_s_e2e,
                counterpart=labels[counterpart] if counterpart else None,
                counterpart_ratio=ratios.get(counterpart) if counterpart else None,
                counterpart_ratio_e2e=_ratio(by_key[counterpart], theirs, e2e=True) if counterpart else None,
                best=labels[best],
                best_ratio=ratios[best],
            )
        )
    return out
