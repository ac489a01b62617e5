"""Tokenizer, chat template and streaming detokenization.

The vocabulary comes from the model file itself (GGUF metadata or a Hugging
Face folder's tokenizer.json) and is held as a `tokenizers.Tokenizer`, which
is fast and serializable, so a converted tokenizer is cached as one JSON file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer

from augury.errors import AuguryError, NoChatTemplateError

# Tokens that end a turn in common chat formats. A GGUF names one eos id, but
# instruct models also emit these; llama.cpp treats them as end-of-generation
# by their text in the same way.
END_OF_TURN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<eos>", "</s>")

# `tokenizers`' encode holds the GIL for its whole run (about 0.4 s per MB);
# encode_batch releases it. Long texts take the batch path so that a server's
# event loop keeps answering while another thread tokenizes a big prompt. Its
# `_fast` form skips the character offsets: freeing those (with the GIL held)
# stalled every other thread 87 ms for a 2 MB prompt, against 23 ms without,
# and tokenizing took 0.80 s instead of 1.29 s.
GIL_FREE_ABOVE = 1 << 16  # characters


@dataclass
class TokenizerMeta:
    """What the model file says about special tokens and the chat format."""

    bos_token: str | None = None
    eos_token: str | None = None
    add_bos: bool = False
    chat_template: str | None = None
    extra_eos_ids: list[int] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> "TokenizerMeta":
        return cls(**json.loads(text))


class Tokenizer:
    """Text <-> token ids, with the model's special tokens and chat template."""

    def __init__(self, backend: HFTokenizer, meta: TokenizerMeta, *, backend_digest: str | None = None,
                 plain_backend: HFTokenizer | None = None) -> None:
        self.backend = backend
        self.meta = meta
        # sha256 of the tokenizer.json `load` parsed (None when built in memory): a model whose file
        # hashes alike shares these backends instead of parsing its own (`load`'s `share`).
        self.backend_digest = backend_digest
        self.vocab_size = backend.get_vocab_size()
        self.bos_id = backend.token_to_id(meta.bos_token) if meta.bos_token else None
        eos = set(meta.extra_eos_ids)
        for text in (meta.eos_token, *END_OF_TURN_TEXTS):
            token_id = backend.token_to_id(text) if text else None
            if token_id is not None:
                eos.add(token_id)
        self.eos_ids: frozenset[int] = frozenset(eos)
        added = backend.get_added_tokens_decoder().values()
        specials = {t.content for t in added if t.special}
        self.special_texts: tuple[str, ...] = tuple(sorted(specials, key=len, reverse=True))  # longest first
        # A twin that reads special-token text as plain text (its flag is per object, so
        # the twin keeps one tokenizer safe to use from several threads).
        if plain_backend is None:
            plain_backend = HFTokenizer.from_str(backend.to_str())
            plain_backend.encode_special_tokens = True
        self.plain_backend = plain_backend

    @classmethod
    def load(cls, folder: Path, share: "Tokenizer | None" = None) -> "Tokenizer":
        """Load tokenizer.json + augury_tokenizer.json written by `save`.

        share: a tokenizer whose backends to reuse where it was parsed from a tokenizer.json with the
        same bytes (a drafter of the target's family; each keeps its own meta, chat template
        included): parsing a 150k-token vocabulary and its plain-text twin takes over a second on a
        small CPU, and the drafter's vocabulary check is then trivial.
        """
        data = (folder / "tokenizer.json").read_bytes()
        meta = TokenizerMeta.from_json((folder / "augury_tokenizer.json").read_text())
        digest = hashlib.sha256(data).hexdigest()
        if share is not None and share.backend_digest == digest:
            return cls(share.backend, meta, backend_digest=digest, plain_backend=share.plain_backend)
        return cls(HFTokenizer.from_str(data.decode()), meta, backend_digest=digest)

    def save(self, folder: Path) -> None:
        self.backend.save(str(folder / "tokenizer.json"))
        (folder / "augury_tokenizer.json").write_text(self.meta.to_json())

    def encode(self, text: str, *, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """Token ids of text. special: special-token text (a chat template's markers) becomes those tokens;
        False: it is plain text, as text a user wrote must be (see `encode_chat`)."""
        backend = self.backend if special else self.plain_backend
        if len(text) > GIL_FREE_ABOVE:
            batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
            ids = batch([text], add_special_tokens=False)[0].ids
        else:
            ids = backend.encode(text, add_special_tokens=False).ids
        if add_bos is None:
            add_bos = self.meta.add_bos
        if add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special)

    @property
    def vocab(self) -> dict[str, int]:
        return self.backend.get_vocab()

    def apply_chat_template(
        self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """Render messages with the model's own chat template (from its file), as transformers renders it.

        tools: JSON schemas of callable tools, for templates with a tool block.
        """
        if not self.meta.chat_template:
            raise NoChatTemplateError("this model has no chat template; run without --chat and give a plain prompt")
        return _compiled(self.meta.chat_template).render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.meta.bos_token or "",
            eos_token=self.meta.eos_token or "",
        )

    def encode_chat(
        self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> list[int]:
        """Token ids of messages through the chat template, each message's text read as plain text.

        Only the template's own markers become special tokens: a message that
        says "<|im_end|><|im_start|>system" gets those characters, not a closed
        turn and a forged one. Where each content lies in the rendered text is
        found by rendering again with every content between random markers; a
        template that changes the content itself (trims or splits it) cannot be
        traced that way, and then the special texts inside the contents are
        swapped for markers before rendering instead.
        """
        render = functools.partial(self.apply_chat_template, add_generation_prompt=add_generation_prompt, tools=tools)
        rendered = render(messages)
        if not self.special_texts:
            return self.encode(rendered, add_bos=False)
        nonce = secrets.token_hex(8)  # unguessable, so no content can fake a marker
        opening, closing = f"\ufdd0{nonce}<", f">{nonce}\ufdd1"
        marked = [{**m, "content": opening + m["content"] + closing} if isinstance(m.get("content"), str) else m
                  for m in messages]
        try:
            parts = _traced_parts(render(marked), opening, closing)
        except (AuguryError, jinja2.TemplateError):  # the template refused the markers: escape instead
            parts = None
        if parts is None or "".join(text for text, _ in parts) != rendered:
            parts = self._escaped_parts(messages, render, nonce)
        return [i for text, content in parts if text for i in self.encode(text, add_bos=False, special=not content)]

    def _escaped_parts(
        self, messages: list[dict], render: Callable[[list[dict]], str], nonce: str
    ) -> list[tuple[str, bool]]:
        """Render with each special text in a content replaced by a marker; (text, is_plain) pieces."""
        specials = re.compile("|".join(map(re.escape, self.special_texts)))  # longest first
        index = {text: i for i, text in enumerate(self.special_texts)}

        def escape(content: str) -> str:
            return specials.sub(lambda found: f"\ufdd0{nonce}#{index[found.group()]}\ufdd1", content)

        escaped = [{**m, "content": escape(m["content"])} if isinstance(m.get("content"), str) else m
                   for m in messages]
        text = render(escaped)
        pieces = re.split(f"\ufdd0{nonce}#(\\d+)\ufdd1", text)
        return [(piece, False) if i % 2 == 0 else (self.special_texts[int(piece)], True)
                for i, piece in enumerate(pieces)]


def _raise_exception(message: str) -> None:
    """What a template calls to refuse a conversation (e.g. roles that do not alternate): one clear line."""
    raise AuguryError(f"chat template: {message}")


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    """jinja's tojson escapes HTML characters; templates expect plain JSON (transformers overrides it the same way)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=8)
def _compiled(source: str) -> jinja2.Template:
    """A model's chat template in the environment transformers renders it in (sandboxed, trimmed blocks,
    loop controls, raise_exception, strftime_now, tojson), so both give the same prompt text."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise AuguryError(f"the model's chat template does not parse: {exc.message} (line {exc.lineno})") from None


def _traced_parts(text: str, opening: str, closing: str) -> list[tuple[str, bool]] | None:
    """Split a render into (text, is_content) by the content markers; None unless they pair up in order."""
    parts: list[tuple[str, bool]] = []
    inside = False
    for i, piece in enumerate(re.split(f"({re.escape(opening)}|{re.escape(closing)})", text)):
        if i % 2 == 0:
            parts.append((piece, inside))
        elif (piece == opening) == inside:  # an opening inside content, or a closing outside it
            return None
        else:
            inside = not inside
    return None if inside else parts


def build_prompt_ids(tokenizer, text: str, chat: bool, system: str | None = None) -> list[int]:
    """Token ids for a prompt: through the model's chat template when asked (message text stays plain
    text, see `Tokenizer.encode_chat`), else the raw text."""
    if not chat:
        return tokenizer.encode(text)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return tokenizer.encode_chat(messages)


class StreamDecoder:
    """Turns a growing list of token ids into text deltas.

    Decoding token by token breaks multi-byte characters and spaces that depend
    on neighbours, so each step decodes a short window that starts a few tokens
    back and emits only the new, complete part (no trailing U+FFFD).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, new_ids: list[int]) -> str:
        """Add committed tokens, return the text they complete."""
        self.ids.extend(new_ids)
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self.prefix_offset : self.read_offset])
        full_text = decode(self.ids[self.prefix_offset :])
        if full_text.endswith("\ufffd") or len(full_text) <= len(prefix_text):
            return ""
        delta = full_text[len(prefix_text) :]
        self.prefix_offset = max(self.read_offset, len(self.ids) - 6)
        self.read_offset = len(self.ids)
        return delta
