"""The default corpus: chat-shaped samples cut from the Python standard library on this machine.

A head learns to predict the target from the target's own states over text,
so the text need not be written by the target (EAGLE-1 trains on fixed
conversations and reports low sensitivity to the data). Text that is on
every machine running augury, with a permissive licence (the PSF licence),
and that resembles what a coding assistant writes: the standard library's
sources and its documentation topics (`pydoc_data`). Each piece becomes one
conversation through the target's chat template: a user turn asking for the
code (from its name and docstring) or about a topic, and the code or the
topic's text as the assistant's answer. The head is measured, and drafts, on
assistant text, so `start` marks where the answer begins.

Nothing here reads the evaluation sets in ../shared/data; a test checks a
sample of this corpus against them.
"""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from augury.errors import AuguryError

TEST_PARTS = frozenset({"test", "tests", "idle_test"})
OUTSIDE_PARTS = frozenset({"site-packages", "dist-packages", "__pycache__"})  # installed packages: other licences
LICENCE = "PSF-2.0 (the Python standard library's sources and pydoc_data topics on this machine)"

# How a user asks for a piece of code; {what} is "function `name`", "class `Name`" and so on,
# {doc} the docstring's first line (templates with it are used only where there is one).
ASK_CODE = (
    "Write the Python {what} from the `{module}` module.",
    "Show me how `{module}` implements the {what}.",
    "Implement a Python {what}: {doc}",
    "Can you write a {what} in Python that does this? {doc}",
    "I need the {what} ({doc}). Please write it in Python.",
    "Give me the source of the {what} in Python's `{module}`.",
)
ASK_MORE = (
    "Continue the {what} from `{module}` after these lines:\n```python\n{tail}\n```",
    "Go on with the {what} of `{module}`; it so far ends with:\n```python\n{tail}\n```",
)
ASK_TOPIC = (
    "Explain {topic} in Python.",
    "What does the Python documentation say about {topic}?",
    "How does {topic} work in Python? Please be thorough.",
)


@dataclass(frozen=True)
class Sample:
    """One conversation: a user request and the answer (text the target reads, not writes)."""

    request: str
    answer: str
    source: str  # where the answer came from (module path or topic), for the head's description

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.request}, {"role": "assistant", "content": self.answer}]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path | None = None, tests: bool = False) -> list[Path]:
    """The standard library's .py files, sorted: the library itself, or (tests=True) its test suites;
    never installed packages."""
    root = root or stdlib_root()
    found = []
    for path in root.rglob("*.py"):
        parts = set(path.relative_to(root).parts)
        if not OUTSIDE_PARTS & parts and bool(TEST_PARTS & parts) == tests:
            found.append(path)
    return sorted(found)


def _pick(options: tuple[str, ...], key: str) -> str:
    """A phrasing chosen by the piece's name (the same corpus on every run and machine)."""
    digest = hashlib.sha256(key.encode()).digest()
    return options[digest[0] % len(options)]


def _pieces(text: str) -> Iterator[tuple[str, str, str, str]]:
    """(kind, name, source, docstring) of each top-level function and class of a module's source, in order."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):  # a file for another Python version (lib2to3 fixtures and the like)
        return
    lines = text.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            yield kind, node.name, "".join(lines[first - 1 : node.end_lineno]), ast.get_docstring(node) or ""


def _parts(source: str, max_chars: int) -> list[str]:
    """A piece's source in consecutive parts of at most max_chars, cut at line ends (a longer line alone)."""
    parts, start = [], 0
    while start < len(source):
        end = len(source) if len(source) - start <= max_chars else source.rfind("\n", start, start + max_chars) + 1
        end = end if end > start else start + max_chars
        parts.append(source[start:end])
        start = end
    return parts


def code_samples(path: Path, root: Path, max_chars: int) -> Iterator[Sample]:
    """One sample per top-level function or class of a module; a piece longer than max_chars goes on in
    further samples that ask for its continuation after its last lines so far."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return
    module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
    for kind, name, source, doc in _pieces(text):
        doc_line = doc.strip().splitlines()[0].strip() if doc.strip() else ""
        templates = ASK_CODE if doc_line else tuple(t for t in ASK_CODE if "{doc}" not in t)
        what = f"{kind} `{name}`"
        parts = _parts(source.rstrip() + "\n", max_chars)
        for i, part in enumerate(parts):
            if i == 0:
                request = _pick(templates, f"{module}.{name}").format(what=what, module=module, doc=doc_line)
            else:
                tail = "\n".join(parts[i - 1].rstrip("\n").splitlines()[-3:])
                request = _pick(ASK_MORE, f"{module}.{name}:{i}").format(what=what, module=module, tail=tail)
            yield Sample(request, f"```python\n{part.rstrip()}\n```", f"{module}.{name}" + (f":{i}" if i else ""))


def topic_samples(topic: str, body: str, max_chars: int) -> Iterator[Sample]:
    """A pydoc documentation topic (a language reference section `help()` shows), in parts of max_chars."""
    body = body.strip()
    readable = topic.replace("-", " ")
    for i in range(0, len(body), max_chars):
        yield Sample(_pick(ASK_TOPIC, f"{topic}:{i}").format(topic=f"'{readable}'"), body[i : i + max_chars],
                     f"pydoc:{topic}:{i}")


def samples(max_chars: int = 1600, root: Path | None = None, seed: int = 0, tests: bool = False) -> Iterator[Sample]:
    """The default corpus, lazily (only what a run reads is parsed): modules and documentation topics in
    a seeded order that mixes them, each module's pieces together. tests=True: the test suites instead
    (more code under the same licence, for runs that want more tokens than the library holds)."""
    root = root or stdlib_root()
    topics: dict[str, str] = {}
    if not tests:
        try:
            from pydoc_data.topics import topics
        except ImportError:
            pass
    units = [(str(p.relative_to(root)), p) for p in source_files(root, tests)] + [(f"pydoc:{t}", t) for t in topics]
    if not units:
        raise AuguryError(f"no Python standard library sources under {root} for the default corpus; give --data")
    units.sort(key=lambda unit: hashlib.sha256(f"{seed}:{unit[0]}".encode()).digest())
    for key, unit in units:
        if isinstance(unit, Path):
            yield from code_samples(unit, root, max_chars)
        else:
            yield from topic_samples(unit, topics[unit], max_chars)
