"""Tokenizer, chat template and streaming detokenization.

The vocabulary comes from the model file itself (GGUF metadata or a Hugging
Face folder's tokenizer.json) and is held as a `tokenizers.Tokenizer`, which
is fast and serializable, so a converted tokenizer is cached as one JSON file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import jinja2.sandbox
from tokenizers import Tokenizer as HFTokenizer

from augury.errors import AuguryError

# Tokens that end a turn in common chat formats. A GGUF names one eos id, but
# instruct models also emit these; llama.cpp treats them as end-of-generation
# by their text in the same way.
END_OF_TURN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<eos>", "</s>")


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

    def __init__(self, backend: HFTokenizer, meta: TokenizerMeta) -> None:
        self.backend = backend
        self.meta = meta
        self.vocab_size = backend.get_vocab_size()
        self.bos_id = backend.token_to_id(meta.bos_token) if meta.bos_token else None
        eos = set(meta.extra_eos_ids)
        for text in (meta.eos_token, *END_OF_TURN_TEXTS):
            token_id = backend.token_to_id(text) if text else None
            if token_id is not None:
                eos.add(token_id)
        self.eos_ids: frozenset[int] = frozenset(eos)

    @classmethod
    def load(cls, folder: Path) -> "Tokenizer":
        """Load tokenizer.json + augury_tokenizer.json written by `save`."""
        backend = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        meta = TokenizerMeta.from_json((folder / "augury_tokenizer.json").read_text())
        return cls(backend, meta)

    def save(self, folder: Path) -> None:
        self.backend.save(str(folder / "tokenizer.json"))
        (folder / "augury_tokenizer.json").write_text(self.meta.to_json())

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of text; special-token text (e.g. from a chat template) is parsed as special."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
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

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """Render messages with the model's own chat template (from its file)."""
        if not self.meta.chat_template:
            raise AuguryError("this model has no chat template; run without --chat and give a plain prompt")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise AuguryError(f"chat template: {message}")

        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
        template = env.from_string(self.meta.chat_template)
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.meta.bos_token or "",
            eos_token=self.meta.eos_token or "",
        )


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
