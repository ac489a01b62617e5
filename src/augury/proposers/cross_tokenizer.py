"""Cross-tokenizer drafting: a small model with another tokenizer drafts text for the target.

Two models with different vocabularies still agree on text, so drafting goes
through text:

1. The target's committed tokens are decoded (special tokens kept, so a chat
   template's markers reach the drafter as text) and re-tokenized with the
   drafter's tokenizer.
2. The drafter's KV cache is reused for the longest common prefix between the
   tokens it holds and that re-tokenization, truncated there (O(1)), and fed the
   rest. Only a window of recent text is re-tokenized each step: older text is
   frozen into drafter tokens once, cut at the start of a whitespace run, where
   tokenizers split words anyway, so freezing rarely changes the tokens.
3. The drafter continues greedily for a few tokens, whatever the user's
   temperature, and stops early once its own top probability falls below a
   confidence threshold (a doubted guess is likely rejected, and on a CPU each
   drafter forward costs real time). Its text is converted back: the target's last few
   committed tokens are decoded, the draft text appended, the whole re-encoded
   with the target's tokenizer, and the tokens after the committed ones are the
   proposal. The last one is dropped unless the drafter ended its turn, since
   the draft stops mid-word more often than not.
4. The proposal is deterministic (q_draft None): verification treats it as a
   point mass, which is lossless at any temperature.

After verification nothing needs rolling back here: the next step's prefix
match finds where the drafter's tokens stop agreeing with the committed text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from augury.cache import KVCache, draft_room, slots_for
from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.base import Draft, ProposerBase, Sequence

WINDOW_CHARS = 256  # recent text re-tokenized for the drafter every step (between 1 and 2 windows)
TARGET_WINDOW = 8  # committed target tokens re-encoded together with the draft text
DECODE_CONTEXT = 4  # tokens decoded before a slice so that its leading space and characters come out right


def decode_after(tokenizer, ids: list[int], start: int) -> str:
    """The text ids[start:] add after ids[:start], special tokens kept.

    Decoding a slice on its own can drop a leading space (sentencepiece strips
    it from the first token) or split a multi-byte character, so a few tokens
    before the slice are decoded with it and their text is cut off again.
    """
    lo = max(0, start - DECODE_CONTEXT)
    head = tokenizer.decode(ids[lo:start], skip_special=False)
    full = tokenizer.decode(ids[lo:], skip_special=False)
    if full.startswith(head):
        return full[len(head) :]
    return tokenizer.decode(ids[start:], skip_special=False)


class TextTracker:
    """The text of a growing token list, decoded incrementally with special tokens kept.

    Tokens that end inside a multi-byte character are held back until the
    character completes, so `text` is always whole characters.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.text = ""
        self.done = 0  # tokens whose text is in self.text

    def update(self, ids: list[int]) -> bool:
        """Catch up with ids (an extension of what was seen); True if the text covers all of them."""
        if len(ids) > self.done:
            new = decode_after(self.tokenizer, ids, self.done)
            if new.endswith("\ufffd"):
                return False
            self.text += new
            self.done = len(ids)
        return True


def draft_text_to_target(tokenizer, committed: list[int], draft_text: str, *, complete: bool) -> list[int]:
    """Target tokens that continue `committed` with `draft_text`.

    The last committed tokens are re-encoded together with the draft text so
    that the draft is split the way the target would split it after them. If
    that changes the committed tokens themselves (the draft merges with the
    last one), the draft text is encoded on its own. Unless the draft is
    complete (the drafter ended its turn), its last token is dropped: it may be
    the first part of a longer word.
    """
    recent = committed[-TARGET_WINDOW:]
    recent_text = decode_after(tokenizer, committed, len(committed) - len(recent))
    ids = tokenizer.encode(recent_text + draft_text, add_bos=False)
    if ids[: len(recent)] == recent:
        tokens = ids[len(recent) :]
    else:
        tokens = tokenizer.encode(draft_text, add_bos=False) if draft_text else []
    return tokens if complete else tokens[:-1]


def word_start_before(text: str, lo: int, hi: int) -> int:
    """The last index in (lo, hi] where a whitespace run starts (hi if there is none)."""
    for i in range(hi, lo, -1):
        if text[i].isspace() and not text[i - 1].isspace():
            return i
    return hi


@dataclass
class _CrossState:
    cache: KVCache
    context: TextTracker  # the target's committed text
    ids: list[int] = field(default_factory=list)  # drafter tokens in the cache, in order
    frozen_ids: list[int] = field(default_factory=list)  # drafter tokens of context.text[:frozen_chars]
    frozen_chars: int = 0
    trusted: int = 0  # ids[:trusted] == frozen_ids[:trusted], known without comparing


class CrossTokenizerProposer(ProposerBase):
    """Drafting with a model whose tokenizer differs from the target's, through text.

    Nothing to roll back after a step (the base class's `on_step`): the next
    proposal's prefix match drops what the target did not keep.
    """

    name = "cross"

    def __init__(self, draft: Model, target: Model, *, confidence: float = 0.0) -> None:
        if not 0.0 <= confidence < 1.0:
            raise AuguryError(f"draft confidence must be in [0, 1), got {confidence}")
        self.model = draft
        self.target = target
        self.confidence = confidence
        self.states: dict[int, _CrossState] = {}
        self._forwards = 0
        # Drafter end-of-turn tokens whose text the target reads as one of its own
        # end tokens: proposing that lets the target stop right after a draft.
        self.eos_text: dict[int, str] = {}
        for token in draft.tokenizer.eos_ids:
            text = draft.tokenizer.decode([token], skip_special=False)
            as_target = target.tokenizer.encode(text, add_bos=False) if text else []
            if len(as_target) == 1 and as_target[0] in target.tokenizer.eos_ids:
                self.eos_text[token] = text

    @property
    def forwards(self) -> int:
        return self._forwards

    def start(self, seq: Sequence, prompt_hidden=None) -> None:
        context = TextTracker(self.target.tokenizer)
        context.update(seq.tokens)
        # No drafter token is shorter than a byte, and a target token rarely
        # becomes more than four drafter tokens.
        size = slots_for(len(context.text.encode()), 4 * seq.params.max_tokens)
        cache = self.model.decoder.new_cache(1, min(size, self.model.config.context_length))
        state = _CrossState(cache=cache, context=context)
        self.states[seq.id] = state
        wanted = self._wanted(state)
        if len(wanted) > 1:
            self._feed(state, wanted[:-1])

    def _encode(self, text: str, at_start: bool) -> list[int]:
        """Drafter tokens of a piece of the context; only the piece at the start gets a BOS."""
        return self.model.tokenizer.encode(text, add_bos=None if at_start else False)

    def _wanted(self, state: _CrossState) -> list[int]:
        """The drafter tokens for the whole committed text: the frozen ones plus the recent window re-encoded."""
        text = state.context.text
        limit = len(text) - WINDOW_CHARS
        if limit - state.frozen_chars >= WINDOW_CHARS:
            split = word_start_before(text, state.frozen_chars, limit)
            state.frozen_ids += self._encode(text[state.frozen_chars : split], state.frozen_chars == 0)
            state.frozen_chars = split
        return state.frozen_ids + self._encode(text[state.frozen_chars :], state.frozen_chars == 0)

    def _feed(self, state: _CrossState, tokens: list[int]) -> torch.Tensor:
        """Run tokens through the drafter, return the last row's logits [V]."""
        decoder = self.model.decoder
        logits = decoder.forward(torch.tensor([tokens], device=decoder.device), state.cache,
                                 logits_rows=slice(-1, None))
        state.ids += tokens
        self._forwards += 1
        return logits[0, -1]

    def _sync(self, state: _CrossState, wanted: list[int]) -> torch.Tensor:
        """Make the cache hold `wanted`, reusing its longest common prefix; logits after the last [V]."""
        n = min(len(state.ids), len(wanted))
        same = min(state.trusted, n)
        while same < n and state.ids[same] == wanted[same]:
            same += 1
        keep = min(same, len(wanted) - 1)  # feed at least one token to get logits
        state.cache.truncate(keep)
        del state.ids[keep:]
        logits = self._feed(state, wanted[keep:])
        state.trusted = len(state.frozen_ids)
        return logits

    def propose(self, seq: Sequence, k: int) -> Draft:
        state = self.states[seq.id]
        if not state.context.update(seq.tokens):
            return Draft([])  # the committed text ends inside a character: nothing to continue from
        wanted = self._wanted(state)
        max_steps = 2 * k + 2  # drafter tokens are often shorter than the target's
        if not wanted or max_steps > draft_room(state.cache.max_len, len(wanted)):
            return Draft([])
        logits = self._sync(state, wanted)
        drafted: list[int] = []
        tokens: list[int] = []
        for step in range(max_steps):
            token = int(logits.argmax())
            ended = token in self.model.tokenizer.eos_ids
            if not ended:
                drafted.append(token)
            before = wanted[-DECODE_CONTEXT:]
            text = decode_after(self.model.tokenizer, before + drafted, len(before)).rstrip("\ufffd")
            if ended:
                tokens = draft_text_to_target(
                    self.target.tokenizer, seq.tokens, text + self.eos_text.get(token, ""), complete=True
                )
                break
            tokens = draft_text_to_target(self.target.tokenizer, seq.tokens, text, complete=False)
            if len(tokens) >= k or step == max_steps - 1 or self._doubts(logits, token):
                break
            logits = self._feed(state, [token])
        vocab = self.target.config.vocab_size
        tokens = tokens[:k]
        tokens = tokens[: next((i for i, t in enumerate(tokens) if t >= vocab), len(tokens))]
        return Draft(tokens)

    def _doubts(self, logits: torch.Tensor, token: int) -> bool:
        """Whether the drafter's probability of its own pick (logits [V]) is below the confidence threshold."""
        return self.confidence > 0 and float(torch.softmax(logits.float(), -1)[token]) < self.confidence

    def finish(self, seq: Sequence) -> None:
        self.states.pop(seq.id, None)


def build(target: Model, options) -> CrossTokenizerProposer:
    """Load the draft model (default smollm2-135m-instruct) and draft for `target` through text."""
    from augury.models.loader import load_model
    from augury.proposers import quantize_draft

    name = options.draft
    draft = load_model(name, dtype=options.dtype, device=options.device, offline=options.offline, exact=False)
    return CrossTokenizerProposer(quantize_draft(draft, options.draft_quant), target,
                                  confidence=options.draft_confidence)
