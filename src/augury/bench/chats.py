"""Multi-turn chats in the load test: time to first token by turn, the prefix cache's use case.

A chat client re-sends the whole history every turn. Without a prefix cache
the server prefills all of it again, so each turn waits longer than the last;
with one, a turn prefills only its new tokens (the last reply and the next
question). `augury loadtest --chat-turns T` runs, on every server after the
levels, a few conversations of T turns, each alone (nothing else on the
server, so a turn's TTFT is its prefill and its queueing, nothing more): turn
1 is a suite prompt, every later turn adds the server's reply and FOLLOW_UP.
Issue 24's goal: a second turn's TTFT at most 0.3x its first turn's.
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

    def to_json(self) -> dict:
        return {"server": self.server, "prompt": self.prompt, "ttft_s": list(self.ttft_s)}


def run_chat(client: EndpointContender, server: str, first: Messages, prompt: int, turns: int,
             max_tokens: int) -> ChatResult:
    """One greedy conversation of `turns` turns, each turn's whole history sent again."""
    messages = list(first)
    ttfts = []
    for _ in range(turns):
        outcome = client.generate(messages, None, SamplingParams(temperature=0.0, max_tokens=max_tokens))
        ttfts.append(outcome.stats.prefill_s)
        messages = [*messages, {"role": "assistant", "content": outcome.text}, {"role": "user", "content": FOLLOW_UP}]
    return ChatResult(server, prompt, tuple(ttfts))


def run_chats(client: EndpointContender, server: str, prompts: Sequence[Messages], turns: int, max_tokens: int,
              chats: int = DEFAULT_CHATS) -> list[ChatResult]:
    """`chats` conversations (the first prompts), one after another. Each first turn opens with its own
    line, so a prefix cache that holds the suite's prompts from the levels before cannot serve it: a
    first turn's TTFT is its prefill, as a new conversation's is."""
    return [run_chat(client, server, fresh(prompts[i], i), i, turns, max_tokens)
            for i in range(min(chats, len(prompts)))]


def fresh(messages: Messages, chat: int) -> Messages:
    """The messages with the first user turn opened by a line naming the conversation."""
    out = [dict(m) for m in messages]
    first = next(m for m in out if m["role"] == "user")
    first["content"] = f"Conversation {chat + 1}.\n{first['content']}"
    return out


def second_turn_ratio(results: Sequence[ChatResult]) -> float | None:
    """Mean over conversations of turn 2's TTFT over turn 1's (None without two turns)."""
    ratios = [r.ttft_s[1] / r.ttft_s[0] for r in results if len(r.ttft_s) > 1 and r.ttft_s[0] > 0]
    return statistics.fmean(ratios) if ratios else None


def chat_table(results: Sequence[ChatResult], labels: dict[str, str]) -> Table:
    """Mean TTFT by turn per server, and turn 2 over turn 1."""
    servers = list(dict.fromkeys(r.server for r in results))
    turns = max((len(r.ttft_s) for r in results), default=0)
    rows = []
    for server in servers:
        mine = [r for r in results if r.server == server]
        means = [statistics.fmean(r.ttft_s[t] for r in mine if len(r.ttft_s) > t) for t in range(turns)]
        ratio = second_turn_ratio(mine)
        rows.append([labels.get(server, server), str(len(mine)), *(f"{m:.2f}" for m in means),
                     "—" if ratio is None else f"{ratio:.2f}x"])
    headers = ["server", "chats", *(f"turn {t + 1} TTFT (s)" for t in range(turns)), "turn 2 / turn 1"]
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
