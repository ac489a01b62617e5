"""A small model with the target's tokenizer drafts autoregressively.

The drafter keeps its own KV cache per sequence and remembers how many of the
sequence's tokens it holds. Proposing first feeds whatever it has not seen (the
recovered or bonus token, and after a fully accepted draft also the last
drafted token, which was proposed but never fed), then drafts up to k tokens
one forward each. After verification it rolls its cache back to the tokens
that survived, by moving the length pointer.

On a CPU the drafter's own cost decides the speed-up, so two knobs keep it
lean, neither of which can change the output (the target verifies whatever is
proposed):
- confidence: stop drafting once the drafter's own top probability falls below
  a threshold; a guess it doubts is likely rejected and costs a forward.
- vocab_limit: project only onto the first N token ids. BPE vocabularies are
  ordered roughly by merge frequency, so the head shrinks a lot (for a 0.5B
  Qwen the output matrix is over a quarter of all weights) while nearly every
  drafted token stays reachable; tokens past N are still produced by the target
  as recovered or bonus tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from augury.cache import KVCache
from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.base import Draft, Sequence
from augury.sampling import probabilities, sample


@dataclass
class _DraftState:
    cache: KVCache
    fed: int  # how many of seq.tokens are in the cache
    drafted: list[int]


def check_same_vocabulary(target: Model, draft: Model) -> None:
    """Refuse a draft model whose tokens do not mean the same as the target's."""
    t_vocab, d_vocab = target.tokenizer.vocab, draft.tokenizer.vocab
    same = len(t_vocab) == len(d_vocab) and all(d_vocab.get(tok) == idx for tok, idx in t_vocab.items())
    if not same:
        raise AuguryError(
            f"draft model {draft.name} has a different tokenizer than target {target.name}; "
            "use --draft-method cross for drafts from a model with another tokenizer"
        )


class DraftModelProposer:
    """Drafting with a smaller model of the same family (same tokenizer)."""

    name = "model"

    def __init__(
        self, draft: Model, target_vocab_size: int, *, confidence: float = 0.0, vocab_limit: int = 0
    ) -> None:
        if not 0.0 <= confidence < 1.0:
            raise AuguryError(f"draft confidence must be in [0, 1), got {confidence}")
        if vocab_limit < 0:
            raise AuguryError(f"draft vocabulary limit must be >= 0 (0 = full), got {vocab_limit}")
        self.model = draft
        self.decoder = draft.decoder
        if 0 < vocab_limit < draft.config.vocab_size:
            self.decoder = draft.decoder.with_head_rows(vocab_limit)
        self.target_vocab_size = target_vocab_size
        self.confidence = confidence
        self.states: dict[int, _DraftState] = {}
        self._forwards = 0

    @property
    def forwards(self) -> int:
        return self._forwards

    def start(self, seq: Sequence) -> None:
        max_len = len(seq.tokens) + seq.params.max_tokens + 64
        cache = self.decoder.new_cache(1, max_len)
        state = _DraftState(cache=cache, fed=0, drafted=[])
        self.states[seq.id] = state
        if len(seq.tokens) > 1:
            self._feed(state, seq.tokens[:-1])

    def _feed(self, state: _DraftState, tokens: list[int]) -> torch.Tensor:
        """Run tokens through the drafter, return the last row's logits [V]."""
        logits = self.decoder.forward(
            torch.tensor([tokens], device=self.decoder.device), state.cache, logits_rows=slice(-1, None)
        )
        state.fed += len(tokens)
        self._forwards += 1
        return logits[0, -1]

    def propose(self, seq: Sequence, k: int) -> Draft:
        state = self.states[seq.id]
        params = seq.params
        room = state.cache.max_len - len(seq.tokens) - 16
        k = max(0, min(k, room))
        if k == 0:
            return Draft([])
        logits = self._feed(state, seq.tokens[state.fed :])
        tokens: list[int] = []
        rows = []
        for i in range(k):
            if i > 0:
                logits = self._feed(state, tokens[-1:])
            q_row = probabilities(logits[None], params, seq.prompt, seq.output, tokens)[0]
            if params.greedy:
                token = int(q_row.argmax())
                doubt = self.confidence and float(torch.softmax(logits, -1)[token]) < self.confidence
            else:
                token = int(sample(q_row[None], seq.generator)[0])
                rows.append(q_row)
                doubt = self.confidence and float(q_row[token]) < self.confidence
            tokens.append(token)
            if doubt:
                break
        state.drafted = tokens
        q_draft = None
        if rows:
            q_draft = torch.stack(rows)
            if q_draft.shape[-1] < self.target_vocab_size:
                q_draft = torch.nn.functional.pad(q_draft, (0, self.target_vocab_size - q_draft.shape[-1]))
            q_draft = q_draft[:, : self.target_vocab_size]
        return Draft(tokens, q_draft)

    def on_verified(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        state = self.states[seq.id]
        # The cache holds the old tokens plus drafted[:k-1] (the last drafted
        # token was never fed). Keep the old tokens and the accepted ones.
        old = len(seq.tokens) - num_accepted - 1
        keep = old + min(num_accepted, max(num_drafted - 1, 0))
        state.fed = min(state.fed, keep)
        state.cache.truncate(state.fed)
        state.drafted = []

    def finish(self, seq: Sequence) -> None:
        self.states.pop(seq.id, None)
