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
- vocab_limit: project only onto N token ids (`draft_vocab.py`: the most
  frequent in a corpus, or the first N), so the head shrinks a lot (for a 0.5B
  Qwen the output matrix is over a third of what a step reads) while nearly
  every drafted token stays reachable; the others are still produced by the
  target as recovered or bonus tokens.
- context: read only the last N tokens of what a sequence holds when the
  drafter starts on it (its cache then begins there, at position 0). A long
  prompt (a document to summarize or answer from) costs the drafter a prefill
  of N tokens rather than of the whole prompt, which on a CPU can cost as much
  as the drafting it buys; what the drafter no longer sees only shapes its
  guesses. After the start it reads every token the target commits.

Guesses make a round's forwards fewer without changing its draft: a caller
with a free guess of how the text goes on (the hybrid's suffix matcher) hands
`propose_batch` a guesser, and each forward runs the guessed tokens after its
own rows (the catch-up, or the token drafted last). Row j's logits then follow
the guesses 1..j, so while each guess is the token the drafter picks from the
row before, the drafter has drafted it already, and the next row gives its
next pick; the first guess it would not have drafted, and every row after it,
is dropped from its cache. A drafted token costs a forward only where the
guesses were wrong (staged, or cascade, speculation: Spector and Re 2023, Chen
et al. 2023, with the matcher as the lowest stage).

With a prefix cache (`use_prefix_cache`, given by the batching scheduler) a
sequence starts on the rows the drafter kept of earlier sequences with the same
start, and its rows are kept when it finishes. The drafter's rows only shape its
guesses, never what the target commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from augury.cache import CacheGroup, KVCache, draft_room, slots_for
from augury.errors import AuguryError
from augury.models.decoder import Decoder
from augury.models.loader import Model
from augury.prefix_cache import PrefixCache
from augury.proposers.base import Draft, ProposerBase, Sequence
from augury.proposers.guess_plan import GuessPlan
from augury.sampling import draw, greedy_tokens, probabilities, sample
from augury.verify import VerifyResult

# guesser(seq, drafted, n): up to n tokens guessed to follow seq.tokens + drafted (`propose_batch`)
Guesser = Callable[[Sequence, list[int], int], list[int]]
START_ROWS = 512  # rows one batched drafter prefill may hold (its activations grow with them)
# The most rows a drafting forward holds with its guesses (`propose_batch`; `GuessPlan` chooses how many
# guesses within it): a drafter stops at K <= 4 or so anyway, and past a few rows each row adds its own
# arithmetic (docs/benchmarks.md 36).
GUESS_ROWS = 4


@dataclass
class _DraftState:
    cache: KVCache
    fed: int  # seq.tokens[offset:fed] are in the cache
    drafted: list[int]
    offset: int = 0  # the first token the cache holds (`context`); its row 0

    def cut(self) -> None:
        """Drop cache rows past seq.tokens[fed - 1]."""
        self.cache.truncate(self.fed - self.offset)


class DraftModelProposer(ProposerBase):
    """Drafting with a smaller model of the same family (same tokenizer)."""

    name = "model"
    checks_guesses = True  # propose_batch takes a guesser whose continuations it checks (a hybrid's matcher)

    def __init__(
        self, draft: Model, target_vocab_size: int, *, confidence: float = 0.0, vocab_limit: int | torch.Tensor = 0,
        context: int = 0,
    ) -> None:
        """vocab_limit: project onto the first N token ids (an int; 0 = all), or onto the given ascending ids
        (a tensor, `draft_vocab.head_vocab`). context: read only the last N tokens at a start (0 = all)."""
        if not 0.0 <= confidence < 1.0:
            raise AuguryError(f"draft confidence must be in [0, 1), got {confidence}")
        if context < 0:
            raise AuguryError(f"draft context must be >= 0 tokens (0 = the whole sequence), got {context}")
        self.context = context
        self.model = draft
        self.decoder = head_restricted(draft.decoder, vocab_limit)
        self.target_vocab_size = target_vocab_size
        self.confidence = confidence
        self.states: dict[int, _DraftState] = {}
        self._forwards = 0
        self.guess_plan = GuessPlan(GUESS_ROWS)
        self.prefix: PrefixCache | None = None

    def prefix_token_bytes(self) -> int:
        """K/V bytes one token takes in this drafter's cache (the scheduler splits a prefix cache budget by it)."""
        c = self.decoder.config
        return 2 * c.num_layers * c.num_kv_heads * c.head_dim * self.decoder.dtype.itemsize

    def use_prefix_cache(self, prefix: PrefixCache) -> None:
        """Start sequences on the rows of earlier ones with the same start, and keep each finished one's rows
        (the cache's arena reserved now, in this drafter's geometry)."""
        c = self.decoder.config
        prefix.reserve(c.num_layers, c.num_kv_heads, c.head_dim, self.decoder.dtype, self.decoder.device)
        self.prefix = prefix

    @property
    def forwards(self) -> int:
        return self._forwards

    def start_offset(self, length: int) -> int:
        """The first of a sequence's `length` tokens the drafter reads when it starts on them (`context`)."""
        return max(0, length - 1 - self.context) if self.context else 0

    def start(self, seq: Sequence, prompt_hidden=None) -> None:
        self.start_batch([seq])

    def start_batch(self, seqs: list[Sequence]) -> None:
        """Prefill the drafter on each sequence's tokens but the last, prompts of like length in one forward.

        A burst of new requests in a server starts in a few drafter forwards
        rather than one each. A group's caches are rows of one pool (row views,
        see `KVCache.rows`), so the group prefills as one batch, attended as a
        block however long its prompts are. A forward is padded to its longest
        block, so a group holds blocks at least half as long as its first
        (longest) one, and at most START_ROWS rows unless one block is longer.
        """
        def block(seq: Sequence) -> list[int]:  # every token but the last, from the start offset
            return seq.tokens[self.start_offset(len(seq.tokens)) : -1]

        todo = sorted(seqs, key=lambda seq: -len(block(seq)))
        if self.prefix is not None:
            todo = [seq for seq in todo if not self._start_from_prefix(seq)]
        while todo:
            longest = len(block(todo[0]))
            fits = max(1, START_ROWS // max(longest, 1))
            # at least half the longest block (so no empty block joins a non-empty one)
            group = [seq for seq in todo[:fits] if 2 * len(block(seq)) >= longest]
            todo = todo[len(group) :]
            max_len = max(slots_for(len(seq.tokens), seq.params.max_tokens) for seq in group)
            pool = self.decoder.new_cache(len(group), max_len)
            states = []
            for b, seq in enumerate(group):
                offset = self.start_offset(len(seq.tokens))
                states.append(_DraftState(cache=pool.rows(b, b + 1), fed=offset, drafted=[], offset=offset))
            self.states.update((seq.id, state) for seq, state in zip(group, states))
            if longest > 0:
                self._feed(states, [block(seq) for seq in group], cache=pool)

    def prefill_batch(self, seqs: list[Sequence], counts: list[int]) -> list[int]:
        """Feed each sequence's next counts[i] tokens the drafter has not seen, drafting nothing; returns
        how many of each sequence's tokens the drafter now holds.

        A batching server starts a drafter on a long prompt this way, a piece
        per step, so that the streams running beside it wait for a piece's
        forward at a time rather than the whole prompt's. A new sequence opens
        on the prefix cache's rows of its start where there are any. The last
        committed token is never fed here: drafting feeds it.
        """
        states = []
        for seq in seqs:
            state = self.states.get(seq.id)
            if state is None:
                cache = self.decoder.new_cache(1, slots_for(len(seq.tokens), seq.params.max_tokens))
                offset = self.start_offset(len(seq.tokens))
                state = self.states[seq.id] = _DraftState(cache=cache, fed=offset, drafted=[], offset=offset)
                if self.prefix is not None and offset == 0:
                    block = seq.tokens[:-1]
                    state.fed = self.prefix.take(block, len(block), cache) if block else 0
            states.append(state)
        blocks = [seq.tokens[state.fed : min(state.fed + n, len(seq.tokens) - 1)]
                  for seq, state, n in zip(seqs, states, counts)]
        fed = [(state, block) for state, block in zip(states, blocks) if block]
        if fed:
            self._feed([state for state, _ in fed], [block for _, block in fed])
        return [state.fed for state in states]

    def _start_from_prefix(self, seq: Sequence) -> bool:
        """Start a sequence alone on the prefix cache's rows of its start, then feed the rest; False if none are
        cached or the drafter does not read the sequence from its start (`context`)."""
        block = seq.tokens[:-1]
        if self.start_offset(len(seq.tokens)) > 0:
            return False
        if self.prefix.lookup(block, len(block)).length == 0:
            self.prefix.misses += 1
            return False
        cache = self.decoder.new_cache(1, slots_for(len(seq.tokens), seq.params.max_tokens))
        state = _DraftState(cache=cache, fed=self.prefix.take(block, len(block), cache), drafted=[])
        self.states[seq.id] = state
        if state.fed < len(block):
            self._feed([state], [block[state.fed :]])
        return True

    def _feed(
        self, states: list[_DraftState], blocks: list[list[int]], cache: KVCache | None = None,
        tails: list[int] | None = None,
    ) -> list[torch.Tensor]:
        """Run each state's block of tokens through the drafter; with tails, the logits of each block's last
        tails[b] rows [tails[b], V], else nothing (the caches are only filled).

        One forward for all of them: ragged blocks are padded with their last
        token (padding comes after the real tokens, so nothing real sees it)
        and each cache is cut back to its real length afterwards. cache: one
        cache whose rows are the states' caches, in order (else the states'
        caches are grouped).
        """
        width = max(len(block) for block in blocks)
        rows = [block + block[-1:] * (width - len(block)) for block in blocks]
        if cache is None:
            cache = states[0].cache if len(states) == 1 else CacheGroup([state.cache for state in states])
        # The head runs from the first row any block wants to the end (padding rows included); one row
        # where none is wanted.
        first = min(len(block) - tail for block, tail in zip(blocks, tails)) if tails is not None else width - 1
        t0 = time.perf_counter()
        logits = self.decoder.forward(
            torch.tensor(rows, device=self.decoder.device), cache, logits_rows=slice(first, None)
        )
        self._forwards += 1
        if tails is not None and len(blocks) == 1:  # a drafting forward of one sequence: its rows' price
            self.guess_plan.observe_forward(width, time.perf_counter() - t0)
        for state, block in zip(states, blocks):
            state.fed += len(block)
            if width > len(block):
                state.cut()
        if tails is None:
            return []
        return [logits[b, len(block) - tail - first : len(block) - first]
                for b, (block, tail) in enumerate(zip(blocks, tails))]

    def propose(self, seq: Sequence, k: int) -> Draft:
        return self.propose_batch([seq], [k])[0]

    def propose_batch(self, seqs: list[Sequence], ks: list[int], guesser: Guesser | None = None) -> list[Draft]:
        """Draft up to ks[i] tokens for each sequence, one drafter forward per position for all.

        Decoding is bound by reading the weights, so a forward over a few
        sequences' rows costs about what one costs (the 0.5B drafter's
        matmuls here: 4 rows about 1.1x one row, 8 rows about 2x): a server
        drafting for 4 sequences pays for about one.

        guesser(seq, drafted, n): up to n tokens guessed to follow seq.tokens +
        drafted (a free drafter's, the hybrid's matcher's), run after each
        forward's own rows and checked (`_checked`): where the drafter would
        have drafted them itself, one forward drafts several tokens. The drafts
        are the ones it drafts without guesses.
        """
        drafts = [Draft([]) for _ in seqs]
        states = [self.states[seq.id] for seq in seqs]
        ks = [min(k, draft_room(state.cache.max_len, len(seq.tokens))) for seq, state, k in zip(seqs, states, ks)]
        live = [i for i, k in enumerate(ks) if k > 0]
        if not live:
            return drafts
        # Only a draft whose tokens follow from the logits alone can take guesses: greedy or coupled
        # (a sampled token drawn by rejection would consume the request's generator differently); and only a
        # sequence drafting alone in its forward (blocks are padded to the longest, and a batch has rows
        # enough). The plan prices each forward's guesses by what rows and guesses measured.
        guessing = {i for i in live if guesser is not None and (seqs[i].params.greedy or seqs[i].params.coupled)}
        tokens: dict[int, list[int]] = {i: [] for i in live}
        q_rows: dict[int, list[torch.Tensor]] = {i: [] for i in live}

        def guesses(i: int, own_rows: int, alone: bool) -> list[int]:
            n = self.guess_plan.guesses(own_rows, ks[i] - len(tokens[i]) - 1) if alone and i in guessing else 0
            return guesser(seqs[i], tokens[i], n)[:n] if n > 0 else []

        # Catch up on what each drafter has not seen (at least the last committed
        # token). Longer catch-ups (after steps without drafting) run alone: they
        # are small prefills, which attend as one block rather than row by row.
        # Then one forward a position, each with its sequences' guesses after the token drafted last.
        short = [i for i in live if len(seqs[i].tokens) - states[i].fed <= self.decoder.row_attention_limit]
        groups = [group for group in [short] + [[i] for i in live if i not in short] if group]
        own = {i: seqs[i].tokens[states[i].fed :] for i in live}
        while groups:
            going = []
            for group in groups:
                guessed = [guesses(i, len(own[i]), len(group) == 1) for i in group]
                blocks = [own[i] + g for i, g in zip(group, guessed)]
                rows = self._feed([states[i] for i in group], blocks, tails=[len(g) + 1 for g in guessed])
                for i, g, r in zip(group, guessed, rows):
                    if self._checked(seqs[i], states[i], r, g, ks[i], tokens[i], q_rows[i]):
                        going.append(i)
                        own[i] = tokens[i][-1:]
            groups = [going] if going else []
        for i in tokens:
            states[i].drafted = tokens[i]
            drafts[i] = Draft(tokens[i], self._q_draft(q_rows[i]))
        return drafts

    def _checked(
        self, seq: Sequence, state: _DraftState, rows: torch.Tensor, guessed: list[int], k: int,
        tokens: list[int], q_rows: list[torch.Tensor],
    ) -> bool:
        """Draft from one forward's rows [1 + len(guessed), V]: row 0 follows the tokens fed before the
        guesses, row j the guesses 1..j. Each row's token is picked as always; the next row holds its
        logits only while the guess there is the token picked. The cache keeps the guesses that were
        picked (the drafter's own tokens, fed as a draft's are) and drops the rest. Returns whether to
        draft on (a further forward, which feeds the token picked last)."""
        used = checked = 0
        going = self._pick(seq, rows[0], tokens, q_rows) and len(tokens) < k
        while going and used < len(guessed):
            checked += 1
            if tokens[-1] != guessed[used]:
                break
            used += 1
            going = self._pick(seq, rows[used], tokens, q_rows) and len(tokens) < k
        if guessed:
            self.guess_plan.observe_guesses(checked, used)
        if used < len(guessed):  # the guesses past the last one picked leave the cache
            state.fed -= len(guessed) - used
            state.cut()
        return going

    def _pick(self, seq: Sequence, logits: torch.Tensor, tokens: list[int], q_rows: list[torch.Tensor]) -> bool:
        """Choose the next drafted token from the drafter's logits [V]; False if the drafter doubts it."""
        params = seq.params
        if params.greedy:
            token = int(greedy_tokens(logits[None], params, seq.prompt, seq.output, tokens)[0])
            tokens.append(token)
            return not self.confidence or float(torch.softmax(logits, -1)[token]) >= self.confidence
        q_row = probabilities(logits[None], params, seq.prompt, seq.output, tokens)[0]
        if params.coupled:
            # The target's noise at this output position, over the target's vocabulary: the
            # draft is the token the target itself would pick if its distribution were q_draft.
            full = torch.nn.functional.pad(q_row, (0, max(0, self.target_vocab_size - q_row.shape[-1])))
            token = draw(full[: self.target_vocab_size], seq, len(seq.output) + len(tokens))
            confidence = float(q_row[token]) if token < q_row.shape[-1] else 0.0
        else:
            token = int(sample(q_row[None], seq.generator)[0])
            q_rows.append(q_row)
            confidence = float(q_row[token])
        tokens.append(token)
        return confidence >= self.confidence

    def _q_draft(self, q_rows: list[torch.Tensor]) -> torch.Tensor | None:
        """Sampled drafts' distributions [n, V_target] (None for greedy drafts, which are point masses)."""
        if not q_rows:
            return None
        q_draft = torch.stack(q_rows)
        if q_draft.shape[-1] < self.target_vocab_size:
            q_draft = torch.nn.functional.pad(q_draft, (0, self.target_vocab_size - q_draft.shape[-1]))
        return q_draft[:, : self.target_vocab_size]

    def on_step(self, seq: Sequence, result: VerifyResult, hidden=None) -> None:
        """Roll the cache back to the committed tokens it holds.

        After drafting, the cache holds the old tokens plus its own drafted[:-1]
        (the last drafted token was never fed); it keeps the old tokens and the
        accepted ones. A step it did not draft for (plain, or another part of a
        hybrid drafted) leaves nothing of its own to drop: its next proposal
        feeds whatever it has not seen.
        """
        state = self.states[seq.id]
        drafted = len(state.drafted)
        accepted = result.num_accepted if drafted else 0
        old = len(seq.tokens) - len(result.tokens)
        keep = old + min(accepted, max(drafted - 1, 0))
        state.fed = min(state.fed, keep)
        state.cut()
        state.drafted = []

    def finish(self, seq: Sequence) -> None:
        """Free the sequence's state; with a prefix cache, keep its rows there (owned by it until the driver settles)."""
        state = self.states.pop(seq.id, None)
        if state is not None and self.prefix is not None and state.offset == 0:
            self.prefix.store(seq.tokens[: state.fed], state.cache, owner=seq.id)


def head_restricted(decoder: Decoder, vocab_limit: int | torch.Tensor) -> Decoder:
    """The decoder projecting onto the first vocab_limit ids (an int; 0 = all) or onto the given ascending
    ids (a tensor): `Decoder.with_head_rows`, with a clear error for a negative limit."""
    if isinstance(vocab_limit, torch.Tensor):
        return decoder.with_head_rows(vocab_limit)
    if vocab_limit < 0:
        raise AuguryError(f"draft vocabulary limit must be >= 0 (0 = full), got {vocab_limit}")
    if 0 < vocab_limit < decoder.config.vocab_size:
        return decoder.with_head_rows(vocab_limit)
    return decoder
