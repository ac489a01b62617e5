"""Constrained decoding: `response_format: {"type": "json_object"}` as a mask on the logits.

A constraint says, for each position, which tokens may come next given the
text so far. It is applied in `sampling.probabilities`, the one transform both
sides share: p_target at every verified row and q_draft at every drafted row
see the same mask for the same token history (the output so far plus the
drafted tokens before that row). Rejection sampling between two masked
distributions is still exact, so constrained speculative decoding is
distributed exactly as constrained plain decoding (and greedy output is
identical); a drafter proposing a masked token simply has it rejected.

The JSON grammar is a character-level pushdown automaton (`JsonMachine`); a
token is allowed when feeding its text keeps the output a prefix of a JSON
object. Masks depend only on the automaton's state, so each state's mask over
the vocabulary is computed once and cached. Whitespace outside strings is
limited to single spaces and newlines (no two in a row), so a model cannot
pad forever; the end-of-sequence tokens are allowed once the object is
complete, and nothing else is.
"""

from __future__ import annotations

import torch
from torch import Tensor

WS = " \n"
ESCAPES = '"\\/bfnrt'
HEX = "0123456789abcdefABCDEF"
DIGITS = "0123456789"
# Number modes in which the number may end (the next character then belongs to what follows).
NUMBER_ENDS = frozenset({"zero", "int", "frac", "exp_digits"})
LITERALS = {"t": "rue", "f": "alse", "n": "ull"}

State = tuple[str, str, bool]  # (mode, stack of open '{' / '[', the last character was whitespace)
START: State = ("start", "", False)


class JsonMachine:
    """One character at a time: `step(state, ch)` is the next state, or None if ch cannot follow."""

    @staticmethod
    def step(state: State, ch: str) -> State | None:
        mode, stack, ws = state
        if mode.startswith("str"):
            return JsonMachine._string(mode, stack, ch)
        if mode.startswith("lit:"):
            rest = mode[4:]
            if ch != rest[0]:
                return None
            return (f"lit:{rest[1:]}", stack, False) if len(rest) > 1 else JsonMachine._closed(stack)
        if mode in NUMBER_ENDS or mode in ("sign", "dot", "exp", "exp_sign"):
            number = JsonMachine._number(mode, ch)
            if number is not None:
                return (number, stack, False)
            if mode not in NUMBER_ENDS:
                return None
            return JsonMachine.step(JsonMachine._closed(stack), ch)  # the number ended: ch comes after it
        if ch in WS:
            return None if ws or mode == "done" else (mode, stack, True)
        if mode == "start":
            return ("key_or_end", "{", False) if ch == "{" else None
        if mode in ("value", "value_or_end"):
            if mode == "value_or_end" and ch == "]":
                return JsonMachine._closed(stack[:-1])
            return JsonMachine._value(stack, ch)
        if mode in ("key_or_end", "key"):
            if ch == '"':
                return ("str:key", stack, False)
            if mode == "key_or_end" and ch == "}":
                return JsonMachine._closed(stack[:-1])
            return None
        if mode == "colon":
            return ("value", stack, False) if ch == ":" else None
        if mode == "after":
            top = stack[-1]
            if ch == ",":
                return ("key" if top == "{" else "value", stack, False)
            if ch == ("}" if top == "{" else "]"):
                return JsonMachine._closed(stack[:-1])
            return None
        return None  # done: nothing may follow a complete object

    @staticmethod
    def _closed(stack: str) -> State:
        """A value just ended inside `stack`."""
        return ("after", stack, False) if stack else ("done", "", False)

    @staticmethod
    def _value(stack: str, ch: str) -> State | None:
        if ch == "{":
            return ("key_or_end", stack + "{", False)
        if ch == "[":
            return ("value_or_end", stack + "[", False)
        if ch == '"':
            return ("str:value", stack, False)
        if ch == "-":
            return ("sign", stack, False)
        if ch in DIGITS:
            return ("zero" if ch == "0" else "int", stack, False)
        if ch in LITERALS:
            return (f"lit:{LITERALS[ch]}", stack, False)
        return None

    @staticmethod
    def _string(mode: str, stack: str, ch: str) -> State | None:
        kind = mode.split(":")[-1]  # key or value
        if mode.startswith("str:"):
            if ch == '"':
                return ("colon", stack, False) if kind == "key" else JsonMachine._closed(stack)
            if ch == "\\":
                return (f"stresc:{kind}", stack, False)
            return None if ord(ch) < 0x20 else (mode, stack, False)
        if mode.startswith("stresc:"):
            if ch == "u":
                return (f"stru4:{kind}", stack, False)
            return (f"str:{kind}", stack, False) if ch in ESCAPES else None
        remaining = int(mode[4])  # stru<n>:kind, hex digits still due
        if ch not in HEX:
            return None
        return (f"stru{remaining - 1}:{kind}", stack, False) if remaining > 1 else (f"str:{kind}", stack, False)

    @staticmethod
    def _number(mode: str, ch: str) -> str | None:
        """The next number mode, or None if ch does not continue the number."""
        if mode == "sign":
            return ("zero" if ch == "0" else "int") if ch in DIGITS else None
        if mode in ("zero", "int"):
            if ch in DIGITS:
                return "int" if mode == "int" else None
            return "dot" if ch == "." else "exp" if ch in "eE" else None
        if mode in ("dot", "frac"):
            if ch in DIGITS:
                return "frac"
            return "exp" if mode == "frac" and ch in "eE" else None
        if mode == "exp":
            return "exp_sign" if ch in "+-" else "exp_digits" if ch in DIGITS else None
        return "exp_digits" if ch in DIGITS else None  # exp_sign, exp_digits

    @staticmethod
    def feed(state: State | None, text: str) -> State | None:
        for ch in text:
            if state is None:
                return None
            state = JsonMachine.step(state, ch)
        return state

    @staticmethod
    def complete(state: State | None) -> bool:
        return state is not None and state[0] == "done"


class JsonObjectConstraint:
    """Tokens that keep the output a prefix of one JSON object; the end tokens once it is complete.

    token_texts: the text of every token id (the tokenizer's decoding of each
    one alone); eos_ids: the end-of-sequence ids.
    """

    name = "json_object"

    def __init__(self, token_texts: list[str], eos_ids: frozenset[int]) -> None:
        self.texts = token_texts
        self.eos_ids = frozenset(i for i in eos_ids if i < len(token_texts))
        self._masks: dict[State | None, Tensor] = {}
        # Inside a string most tokens are plain characters, allowed whatever the state: only the
        # others (a quote, a backslash, a control character) need the automaton there.
        self._string_safe = torch.tensor(
            [bool(t) and i not in self.eos_ids and not any(c in '"\\' or ord(c) < 0x20 for c in t)
             for i, t in enumerate(token_texts)], dtype=torch.bool)
        self._string_special = [i for i, t in enumerate(token_texts)
                                if t and i not in self.eos_ids and not self._string_safe[i]]

    @classmethod
    def for_tokenizer(cls, tokenizer, vocab_size: int) -> "JsonObjectConstraint":
        texts = [tokenizer.decode([i]) for i in range(vocab_size)]
        return cls(texts, frozenset(tokenizer.eos_ids))

    def state(self, tokens: list[int]) -> State | None:
        """The automaton's state after the given output tokens (None: not a valid prefix)."""
        return JsonMachine.feed(START, "".join(self.texts[t] for t in tokens if t < len(self.texts)))

    def allowed(self, state: State | None) -> Tensor:
        """bool [V]: which tokens may follow `state` (cached per state)."""
        mask = self._masks.get(state)
        if mask is None:
            mask = torch.zeros(len(self.texts), dtype=torch.bool)
            if JsonMachine.complete(state):
                mask[list(self.eos_ids)] = True
            elif state is not None and state[0].startswith("str:"):
                mask |= self._string_safe
                for i in self._string_special:
                    if JsonMachine.feed(state, self.texts[i]) is not None:
                        mask[i] = True
            elif state is not None:
                for i, text in enumerate(self.texts):
                    if text and i not in self.eos_ids and JsonMachine.feed(state, text) is not None:
                        mask[i] = True
            self._masks[state] = mask
        return mask

    def mask_logits(self, logits: Tensor, output: list[int], drafted: list[int]) -> Tensor:
        """-inf where the grammar forbids a token. logits: [N, V'], the last N positions of
        output + drafted + one (as in `sampling.probabilities`): row i follows
        (output + drafted)[: len(output) + len(drafted) - N + 1 + i].

        V' may be smaller than the vocabulary (a drafter's truncated head) or
        larger (padding ids): ids past the token texts are always forbidden. A
        row after a drafted token the grammar forbids allows nothing; it is left
        as it is, because verification rejects that token before the row is used.
        """
        n, width = logits.shape
        out = logits.clone()
        history = output + drafted
        start = len(history) - n + 1
        for i in range(n):
            allowed = self.allowed(self.state(history[: start + i]))
            row = torch.zeros(width, dtype=torch.bool, device=logits.device)
            keep = min(width, allowed.shape[0])
            row[:keep] = allowed[:keep].to(logits.device)
            if row.any():
                out[i] = out[i].masked_fill(~row, float("-inf"))
        return out
