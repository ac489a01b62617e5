"""A drafter's head on fewer token ids: the first N, or the N most frequent in a corpus every machine has.

A small drafter's output matrix is a large share of the bytes one of its
steps reads (docs/benchmarks.md 9c), so keeping fewer rows makes every drafted
token cheaper. Which ids: those counted most often in the Python standard library's
sources and documentation topics (train/stdlib_corpus.py, PSF licence: no
download, and never the evaluation sets), tokenized by the target's tokenizer,
then the ids the corpus never showed, by id (BPE ids follow merge order,
roughly the frequency in the tokenizer's own training text), with every
special token (end of turn included) kept.

Why `id` is the default order (measured in docs/benchmarks.md 9c): the first
N ids accepted as well as the N most frequent in the corpus, and a prefix of
the head keeps logits of its own width, where other ids are scattered back
into the whole vocabulary for sampling, which costs time per drafted token.

Verification stays exact: the drafter's logits are -inf outside the kept ids,
so q_draft is zero there and sums to one over them, and the target's
recovered and bonus tokens still come from its whole vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.models.tokenizer import Tokenizer

ORDERS = ("corpus", "id")
CORPUS_CHARS = 3_000_000  # characters of the corpus counted (a few seconds of tokenizing)


def corpus_counts(tokenizer: Tokenizer, vocab_size: int, max_chars: int = CORPUS_CHARS) -> Tensor:
    """[vocab_size] how often each id occurs in the first `max_chars` characters of the stdlib corpus."""
    from augury.train import stdlib_corpus

    counts = torch.zeros(vocab_size, dtype=torch.long)
    read = 0
    for sample in stdlib_corpus.samples():
        for text in (sample.request, sample.answer):
            ids = torch.tensor(tokenizer.encode(text, add_bos=False, special=False), dtype=torch.long)
            counts += torch.bincount(ids[ids < vocab_size], minlength=vocab_size)
            read += len(text)
        if read >= max_chars:
            break
    return counts


def ranked_ids(tokenizer: Tokenizer, vocab_size: int, n: int, order: str = "corpus") -> Tensor:
    """The `n` ids a drafter's head keeps, ascending: by corpus frequency then id ("corpus"), or the
    first n ids ("id"); special tokens always among them."""
    if order not in ORDERS:
        raise AuguryError(f"unknown draft vocabulary order '{order}' (choose from {', '.join(ORDERS)})")
    if not 0 < n <= vocab_size:
        raise AuguryError(f"a draft vocabulary of {n} ids must be between 1 and the vocabulary's {vocab_size}")
    if order == "id":
        return torch.arange(n)
    counts = corpus_counts(tokenizer, vocab_size).double()
    vocab = tokenizer.vocab
    specials = [vocab[t] for t in tokenizer.special_texts if t in vocab and vocab[t] < vocab_size]
    specials += [i for i in tokenizer.eos_ids if i < vocab_size]
    counts[torch.tensor(specials, dtype=torch.long)] = float("inf")
    rank = torch.argsort(-counts, stable=True)  # ties (the unseen ids) keep id order
    return rank[:n].sort().values


def head_vocab(draft: Model, n: int, order: str) -> int | Tensor:
    """What a drafter's head keeps for --draft-vocab N: 0 (all), N (the first N ids, sharing the head's
    storage; a negative N is refused by DraftModelProposer) or the ascending ids ranked by the corpus."""
    if order not in ORDERS:
        raise AuguryError(f"unknown draft vocabulary order '{order}' (choose from {', '.join(ORDERS)})")
    if n <= 0 or n >= draft.config.vocab_size or order == "id":
        return n
    return ranked_ids(draft.tokenizer, draft.config.vocab_size, n, order)
