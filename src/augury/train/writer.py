"""The target writes its own corpus in waves: many conversations decoded as one batch, no scheduler.

Why: `corpus.self_corpus` writes through the serving scheduler, which samples, checks and commits
each row on its own and attends each row alone. Writing training text needs none of what that buys
(streaming, per-request settings, speculation, a row's bits apart from its batch), and its per-row
work is what bounds the writing: on a CPU about a sixth of a 64-row step went to per-row sampling,
and on a GPU each row's small kernels cost more than the whole batch's forward. Here a step is one
forward over every row still writing and one pick for all of them; a row that ends leaves the batch
at once (the last row moves into its place, as the scheduler's pool does). The target's states are
then taken by batched prefill over what was written (`features.collect`), as for any other text,
instead of being recorded while writing.

A wave: copies of the chat template's user prefix are continued into user requests (sampled, for
variety), each request goes into the template, and the target answers them all greedily (what greedy
decoding will ask of a drafter).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from augury.models.loader import Model
from augury.sampling import SamplingParams, probabilities, sample
from augury.train.corpus import Corpus, SelfCorpusPlan, user_prefix_ids


@torch.inference_mode()
def continue_batch(
    target: Model,
    prompts: list[list[int]],
    max_new: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    *,
    deadline: float = float("inf"),
) -> tuple[list[list[int]], list[bool]]:
    """Each prompt's continuation, all prompts in one batch: up to max_new tokens, ending before the
    first end-of-turn token. Greedy params pick the argmax; others draw from `probabilities` with the
    generator. Returns the continuations and, per prompt, whether it ended (end of turn or max_new)
    rather than being cut by the deadline (time.monotonic)."""
    decoder = target.decoder
    device = decoder.device
    stop = target.tokenizer.eos_ids
    n = len(prompts)
    lengths = [len(p) for p in prompts]
    longest = max(lengths)
    cache = decoder.new_cache(n, longest + max_new)
    # Right-padded to one block: a causal row never sees the padding after it, whose slots fall
    # past the row's length once the cache is truncated, and are overwritten by its next tokens.
    block = torch.tensor([p + [p[-1]] * (longest - len(p)) for p in prompts], device=device)
    _, states = decoder.forward_states(block, cache, logits_rows=slice(0, 0))  # states [n, longest, H]
    cache.truncate(lengths)
    last = states[torch.arange(n, device=device), torch.tensor(lengths, device=device) - 1]  # [n, H]
    logits = decoder.project(last[:, None])[:, 0]  # [n, V]
    written: list[list[int]] = [[] for _ in prompts]
    ended = [False] * n
    rows = list(range(n))  # rows[r]: the prompt whose sequence cache row r holds
    for _ in range(max_new):
        if time.monotonic() >= deadline:
            break
        picked = (logits.argmax(-1) if params.greedy else sample(probabilities(logits, params), generator)).tolist()
        finished = []
        for r, token in enumerate(picked):
            out = written[rows[r]]
            if token in stop:
                finished.append(r)
                continue
            out.append(token)
            if len(out) >= max_new:
                finished.append(r)
        for r in reversed(finished):  # highest first: every row after r is still writing
            ended[rows[r]] = True
            last_row = len(rows) - 1
            if r != last_row:
                cache.move_row(last_row, r)
                rows[r] = rows[last_row]
                picked[r] = picked[last_row]
            rows.pop()
            picked.pop()
        if not rows:
            break
        live = cache.rows(0, len(rows))
        logits = decoder.forward(torch.tensor(picked, device=device)[:, None], live)[:, 0]
    return written, ended


def write_corpus(
    target: Model,
    plan: SelfCorpusPlan,
    *,
    deadline: float,
    max_sequences: int | None = None,
    on_sequence: Callable[[int, int], None] | None = None,
    on_wave: Callable[[Corpus], float] | None = None,
) -> Corpus:
    """Requests and answers written by the target in waves of plan.max_batch conversations, until the
    deadline (time.monotonic) or max_sequences. A wave's requests cut by the deadline are dropped; its
    answers cut there are kept (text the target wrote, as an answer cut at answer_tokens is).

    The corpus has no states: on_wave(wave) takes each wave's conversations as they are written (to
    prefill them) and returns the seconds it spent, which the next wave leaves free before the deadline
    (a quarter of the time left before the first wave), so the last wave's states still fit.
    on_sequence(sequences, tokens) reports progress."""
    tokenizer = target.tokenizer
    prefix = user_prefix_ids(target)
    generator = torch.Generator(device=target.decoder.device).manual_seed(plan.seed)
    asking = SamplingParams(temperature=plan.temperature, top_p=plan.top_p, max_tokens=plan.request_tokens)
    answering = SamplingParams(max_tokens=plan.answer_tokens)
    corpus = Corpus(description=[plan.describe("waves")])
    wanted = max_sequences if max_sequences is not None else 1 << 62
    reserve = None  # seconds the last wave's on_wave took
    while len(corpus.sequences) < wanted:
        now = time.monotonic()
        writing_ends = deadline - (0.25 * (deadline - now) if reserve is None else 1.25 * reserve)
        if now >= writing_ends:
            break
        n = min(plan.max_batch, wanted - len(corpus.sequences))
        requests, ended = continue_batch(target, [prefix] * n, plan.request_tokens, asking, generator,
                                         deadline=writing_ends)
        texts = [text for text in (tokenizer.decode(ids).strip() for ids, done in zip(requests, ended) if done) if text]
        prompts = [tokenizer.encode_chat([{"role": "user", "content": text}]) for text in texts]
        if not prompts:
            continue
        answers, _ = continue_batch(target, prompts, plan.answer_tokens, answering, None, deadline=writing_ends)
        wave = Corpus()
        for text, prompt, answer in zip(texts, prompts, answers):
            if answer:
                wave.sequences.append(prompt + answer)
                wave.states.append(None)
                wave.starts.append(len(prompt))
                wave.texts.append({"request": text, "answer": tokenizer.decode(answer)})
        reserve = on_wave(wave) if on_wave is not None else 0.0
        for name in ("sequences", "states", "starts", "texts"):
            getattr(corpus, name).extend(getattr(wave, name))
        if on_sequence is not None:
            on_sequence(len(corpus.sequences), corpus.tokens)
    corpus.description[0].update(sequences=len(corpus.sequences), tokens=corpus.tokens)
    return corpus
