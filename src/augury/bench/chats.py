"""Multi-turn chats in the load test: time to first token by turn, the prefix cache's use case.

A chat client re-sends the whole history every turn. Without a prefix cache
the server prefills all of it again, so each turn waits longer than the last;
with one, a turn prefills only its new tokens (the last reply and the next
question). `augury loadtest --chat-turns T` runs, on every server after the
levels, a few conversations of T turns, each alone (nothing else on the
server, so a turn's TTFT is its prefill and its queueing, nothing more): turn
1 is a suite prompt, every later turn adds the server's reply and FOLLOW_UP.
Issue 24's goal: a second turn's TTFT at most 0.3x its first turn's.

How much of that a prefix cache buys depends on how long the first turn was:
after a short question, the reply and the follow-up are most of what turn 2
prefills with or without a cache. So each conversation also sends its turn 2
once more as a new conversation (another opening line, so that nothing past
the chat template's first tokens is cached): turn 2 with the history cached
over the same turn uncached is the cache's own saving.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from augury.bench.endpoint import EndpointContender
from augury.bench.records import Messages
from augury.bench.report import Table
from augury.sampling import SamplingParams

FOLLOW_UP = "Thank you. Now explain the most important step of that in more detail."
GOAL_SECOND_TURN = 0.3  # second-turn TTFT over first-turn TTFT, at most
DEFAULT_CHATS = 4  # conversations per server (the suite's first prompts)


@dataclass(frozen=True)
class ChatResult:
    """One conversation on one server: time to first token of each turn."""

    server: str
    prompt: int  # the suite prompt its first turn asked
    ttft_s: tuple[float, ...]  # by turn, from the first
    uncached_second_s: float | None = None  # turn 2 sent again as a new conversation (none of it cached)

    def to_json(self) -> dict:
        return {"server": self.server, "prompt": self.prompt, "ttft_s": list(self.ttft_s),
                "uncached_second_s": self.uncached_second_s}


def run_chat(client: EndpointContender, server: str, first: Messages, prompt: int, turns: int,
             max_tokens: int) -> ChatResult:
    """One greedy conversation of `turns` turns, each turn's whole history sent again, then its turn 2
    again as a new conversation (`first` without its opening line, see `fresh`)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    messages = fresh(first, prompt)
    ttfts = []
    history: Messages = []  # turn 1's exchange and the follow-up, without the opening line
    for turn in range(turns):
        outcome = client.generate(messages, None, params)
        ttfts.append(outcome.stats.prefill_s)
        exchange = [{"role": "assistant", "content": outcome.text}, {"role": "user", "content": FOLLOW_UP}]
        messages = [*messages, *exchange]
        if turn == 0:
            history = [*first, *exchange]
    uncached = None
    if turns > 1:
        uncached = client.generate(fresh(history, prompt, again=True), None, params).stats.prefill_s
    return ChatResult(server, prompt, tuple(ttfts), uncached)


def run_chats(client: EndpointContender, server: str, prompts: Sequence[Messages], turns: int, max_tokens: int,
              chats: int = DEFAULT_CHATS) -> list[ChatResult]:
    """`chats` conversations (the first prompts), one after another. Each first turn opens with its own
    line, so a prefix cache that holds the suite's prompts from the levels before cannot serve it: a
    first turn's TTFT is its prefill, as a new conversation's is."""
    return [run_chat(client, server, prompts[i], i, turns, max_tokens) for i in range(min(chats, len(prompts)))]


def fresh(messages: Messages, chat: int, again: bool = False) -> Messages:
    """The messages with the first user turn opened by a line naming the conversation (`again`: a line
    of its own for the same conversation sent anew)."""
    out = [dict(m) for m in messages]
    first = next(m for m in out if m["role"] == "user")
    label = f"Conversation {chat + 1}, once more." if again else f"Conversation {chat + 1}."
    first["content"] = f"{label}\n{first['content']}"
    return out


def second_turn_ratio(results: Sequence[ChatResult]) -> float | None:
    """Mean over conversations of turn 2's TTFT over turn 1's (None without two turns)."""
    ratios = [r.ttft_s[1] / r.ttft_s[0] for r in results if len(r.ttft_s) > 1 and r.ttft_s[0] > 0]
    return statistics.fmean(ratios) if ratios else None


def uncached_ratio(results: Sequence[ChatResult]) -> float | None:
    """Mean over conversations of turn 2's TTFT over the same turn's sent as a new conversation."""
    ratios = [r.ttft_s[1] / r.uncached_second_s for r in results
              if len(r.ttft_s) > 1 and r.uncached_second_s]
    return statistics.fmean(ratios) if ratios else None


def chat_table(results: Sequence[ChatResult], labels: dict[str, str]) -> Table:
    """Mean TTFT by turn per server, turn 2 over turn 1, and turn 2 against itself uncached."""
    servers = list(dict.fromkeys(r.server for r in results))
    turns = max((len(r.ttft_s) for r in results), default=0)
    rows = []
    for server in servers:
        mine = [r for r in results if r.server == server]
        means = [statistics.fmean(r.ttft_s[t] for r in mine if len(r.ttft_s) > t) for t in range(turns)]
        ratio = second_turn_ratio(mine)
        cold = [r.uncached_second_s for r in mine if r.uncached_second_s]
        saving = uncached_ratio(mine)
        rows.append([labels.get(server, server), str(len(mine)), *(f"{m:.2f}" for m in means),
                     "—" if ratio is None else f"{ratio:.2f}x",
                     f"{statistics.fmean(cold):.2f}" if cold else "—", "—" if saving is None else f"{saving:.2f}x"])
    headers = ["server", "chats", *(f"turn {t + 1} TTFT (s)" for t in range(turns)), "turn 2 / turn 1",
               "turn 2 uncached (s)", "turn 2 / uncached"]
    return Table("Multi-turn chats: time to first token by turn, each chat alone", headers, rows)


def chat_goals(results: Sequence[ChatResult], labels: dict[str, str]) -> list[str]:
    lines = []
    for server in dict.fromkeys(r.server for r in results):
        ratio = second_turn_ratio([r for r in results if r.server == server])
        if ratio is not None:
            verdict = "met" if ratio <= GOAL_SECOND_TURN else "missed"
            lines.append(f"goal: a second turn's TTFT at most {GOAL_SECOND_TURN}x the first's "
                         f"({labels.get(server, server)}): {verdict} ({ratio:.2f}x)")
    return lines
