"""llama.cpp's own binaries as benchmark peers, and its llama-bench for the forward cost curve.

`llamacpp` runs `llama-completion` (plain decoding) on the target's GGUF;
`llamacpp-spec` runs `llama-speculative-simple --spec-type draft-simple` with
the draft model's GGUF, `llamacpp-lookup` its ngram-simple drafter. One process
per generation; llama.cpp's own timings are used: prompt eval (or "encoded")
is the prefill, eval and sampling (or "decoded") the decode. The binaries come
from the `--llama-cpp` folder, checked before anything loads.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from augury.bench.records import Messages, Outcome
from augury.errors import AuguryError
from augury.metrics import SpecStats
from augury.models.loader import Model
from augury.sampling import SamplingParams


@dataclass(frozen=True)
class LlamaCppTool:
    """One way of running llama.cpp: a binary and, for speculation, its drafter type and draft-length flag."""

    binary: str
    counterpart: str  # the augury method doing the same job, for the ratio in the summary
    spec_type: str | None = None  # None: plain decoding
    k_flag: str | None = None  # the flag that sets the draft length K
    draft_model: bool = False  # runs the draft model's GGUF (-md)


LLAMA_CPP_TOOLS = {
    "llamacpp": LlamaCppTool("llama-completion", "plain"),
    "llamacpp-spec": LlamaCppTool("llama-speculative-simple", "model", "draft-simple", "--spec-draft-n-max",
                                  draft_model=True),
    "llamacpp-lookup": LlamaCppTool("llama-speculative-simple", "ngram", "ngram-simple", "--spec-ngram-simple-size-m"),
}
LLAMA_CPP_TIMEOUT_S = 1800.0
_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


def llama_cpp_binary(folder: str | os.PathLike | None, name: str) -> Path:
    """The path of one llama.cpp binary in the --llama-cpp folder, or one clear error."""
    if folder is None:
        raise AuguryError(
            "the llamacpp peers need --llama-cpp DIR, the folder holding llama.cpp's binaries "
            "(../shared/peers/build-llama-cpp.sh builds them)"
        )
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise AuguryError(f"--llama-cpp {folder}: no such folder")
    path = root / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise AuguryError(f"--llama-cpp {folder} holds no executable {name}")
    return path


def check_llama_cpp(names: list[str], folder: str | os.PathLike | None) -> None:
    """Fail before anything loads if a requested llama.cpp peer's binary is missing."""
    for name in names:
        if name in LLAMA_CPP_TOOLS:
            llama_cpp_binary(folder, LLAMA_CPP_TOOLS[name].binary)


def gguf_file(path: Path | None, role: str) -> Path:
    """llama.cpp reads GGUF files only; say so in one line for anything else."""
    if path is None or path.suffix != ".gguf" or not path.is_file():
        raise AuguryError(f"the llamacpp peers need a GGUF {role}; {path} is not one")
    return path


def run_llama_cpp(command: list[str], timeout_s: float = LLAMA_CPP_TIMEOUT_S) -> tuple[str, str]:
    """Run one llama.cpp binary to the end; its stdout and stderr, or one line naming what went wrong."""
    name = Path(command[0]).name
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise AuguryError(f"{name} did not finish within {timeout_s:.0f} s") from None
    except OSError as exc:
        raise AuguryError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    out = done.stdout.decode("utf-8", errors="replace")
    err = done.stderr.decode("utf-8", errors="replace")
    if done.returncode < 0:  # killed by a signal: its last line is whatever it printed before, not the cause
        hint = CRASH_HINT if -done.returncode in (signal.SIGILL, signal.SIGSEGV) else ""
        raise AuguryError(f"{name} was killed by {_signal_name(-done.returncode)}{hint}")
    if done.returncode != 0:
        last = next((line.strip() for line in reversed(err.splitlines()) if line.strip()), "no message")
        raise AuguryError(f"{name} failed (exit {done.returncode}): {last}")
    return out, err


# What such a crash has been on two Intel machines with AMX (docs/benchmarks.md 9 and 31: SIGSEGV, and
# SIGILL at `tilezero`, in ggml_backend_amx_mul_mat, with the tile state granted to the process):
# llama.cpp's repacked weights choose that path; LLAMA_ARG_REPACK=0 turns repacking off (and is passed
# on to llama-bench as --repack 0).
CRASH_HINT = "; if this CPU has AMX, try LLAMA_ARG_REPACK=0 (llama.cpp's repacked AMX path)"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def repack_flags() -> list[str]:
    """llama-bench's `--repack 0` where LLAMA_ARG_REPACK turns repacking off for the other binaries.

    llama-completion, llama-speculative-simple and llama-server read LLAMA_ARG_* variables; llama-bench
    reads none, so one setting in the environment reaches all of them only if it is passed on here.
    """
    value = os.environ.get("LLAMA_ARG_REPACK", "").strip().lower()
    return ["--repack", "0"] if value in ("0", "false", "off", "no") else []


def _last(pattern: str, text: str, tool: str, what: str) -> tuple[str, ...]:
    """The groups of the last match (a binary may print a figure more than once); a clear error if none."""
    found = re.findall(pattern, text)
    if not found:
        raise AuguryError(f"{tool} printed no '{what}' line; is this llama.cpp's {tool}?")
    last = found[-1]
    return last if isinstance(last, tuple) else (last,)


@dataclass(frozen=True)
class LlamaCppTimings:
    """What one llama.cpp run reported about itself, in augury's terms."""

    prompt_tokens: int
    prefill_s: float
    decode_s: float
    drafted: int = 0
    accepted: int = 0
    committed: int = 0  # tokens the speculative loop committed (its n_predict); 0 for plain decoding


def parse_completion_timings(stderr: str) -> LlamaCppTimings:
    """llama-completion's perf lines: prompt eval is the prefill, eval plus sampling the decode.

    "eval time = Y ms / M runs" covers the forwards after the first token, which
    the prompt's forward yields, the same split as augury's prefill_s. Sampling is
    added to the decode because augury's decode wall time includes its own.
    """
    tool = "llama-completion"
    prefill_ms, prompt_tokens = _last(rf"prompt eval time\s*=\s*{_NUMBER} ms\s*/\s*(\d+) tokens", stderr, tool,
                                      "prompt eval time")
    (eval_ms, _runs) = _last(rf"(?<!prompt )eval time\s*=\s*{_NUMBER} ms\s*/\s*(\d+) runs", stderr, tool, "eval time")
    sampling = re.findall(rf"sampling time\s*=\s*{_NUMBER} ms", stderr)
    sampling_ms = float(sampling[-1]) if sampling else 0.0
    return LlamaCppTimings(int(prompt_tokens), float(prefill_ms) / 1e3, (float(eval_ms) + sampling_ms) / 1e3)


def parse_speculative_timings(stderr: str) -> LlamaCppTimings:
    """llama-speculative-simple's summary: encoded (prefill), decoded (the loop), n_drafted, n_accept."""
    tool = "llama-speculative-simple"
    prompt_tokens, enc_s = _last(rf"encoded\s+(\d+) tokens in\s+{_NUMBER} seconds", stderr, tool, "encoded")
    committed, dec_s = _last(rf"decoded\s+(\d+) tokens in\s+{_NUMBER} seconds", stderr, tool, "decoded")
    (drafted,) = _last(r"n_drafted\s*=\s*(\d+)", stderr, tool, "n_drafted")
    (accepted,) = _last(r"n_accept\s*=\s*(\d+)", stderr, tool, "n_accept")
    return LlamaCppTimings(
        int(prompt_tokens), float(enc_s), float(dec_s), int(drafted), int(accepted), committed=int(committed)
    )


def _sampling_flags(params: SamplingParams) -> list[str]:
    """augury's sampling parameters as llama.cpp flags; its own defaults (top-k 40, min-p 0.05) overridden."""
    flags = [
        "--temp", str(params.temperature), "--top-k", str(params.top_k), "--top-p", str(params.top_p),
        "--min-p", str(params.min_p), "--repeat-penalty", str(params.repetition_penalty),
        "--presence-penalty", str(params.presence_penalty), "--frequency-penalty", str(params.frequency_penalty),
    ]
    if params.seed is not None:
        flags += ["--seed", str(params.seed)]
    if params.ignore_eos:
        flags.append("--ignore-eos")
    return flags


END_OF_TEXT = " [end of text]\n"  # what llama-completion prints after an end-of-sequence token


def completion_answer(stdout: str) -> tuple[str, bool]:
    """The generated text in llama-completion's stdout (prompt not displayed), and whether it hit EOS."""
    text = stdout.removesuffix("\n\n")
    return text.removesuffix(END_OF_TEXT), text.endswith(END_OF_TEXT)


def speculative_answer(stdout: str, prompt: str) -> str:
    """The generated text in llama-speculative-simple's stdout, which echoes the prompt before it."""
    start = stdout.find(prompt)
    if start < 0:
        raise AuguryError("llama-speculative-simple did not echo the prompt; cannot tell its answer apart")
    answer = stdout[start + len(prompt):]
    for tail in ("\n\n\n\n", "\n\n"):
        if answer.endswith(tail):
            return answer[: -len(tail)]
    return answer


class LlamaCppContender:
    """llama.cpp's own binaries on the target's GGUF, one process per generation, timed by llama.cpp.

    The prompt is the very text augury tokenizes (chat template applied), written
    to a file whose special tokens llama.cpp parses; its token count is checked
    against augury's, so both engines see the same prompt. Tokens are counted by
    encoding the answer with augury's tokenizer (the GGUF's own vocabulary):
    llama-speculative-simple's n_predict also counts tokens after an EOS within
    an accepted block, and llama-speculative-simple passes `-n` by up to K tokens
    (counted in its rate, cut from the output). Model loading is outside
    llama.cpp's timings, as augury's is outside its own.
    """

    kind = "peer"
    lossless = False  # other kernels, other numerics

    def __init__(
        self,
        method: str,
        target: Model,
        binary: Path,
        *,
        chat: bool,
        n_ctx: int,
        threads: int,
        k: int = 0,
        draft: Path | None = None,
    ) -> None:
        self.method = method
        self.tool = LLAMA_CPP_TOOLS[method]
        self.k = k if self.tool.spec_type else 0
        self.counterpart = self.tool.counterpart
        self.tokenizer = target.tokenizer
        self.gguf = gguf_file(target.source, "target")
        self.draft = gguf_file(draft, "draft model") if self.tool.draft_model else None
        self.binary = binary
        self.chat = chat
        self.n_ctx = n_ctx
        self.threads = threads

    def command(self, prompt_file: Path, params: SamplingParams) -> list[str]:
        """The llama.cpp command line for one generation."""
        common = [
            str(self.binary), "-m", str(self.gguf), "-f", str(prompt_file), "-t", str(self.threads),
            "-c", str(self.n_ctx), "-b", str(self.n_ctx), "--no-escape", *_sampling_flags(params),
        ]
        if self.tool.spec_type is None:
            return [*common, "-n", str(params.max_tokens), "-no-cnv", "--simple-io", "--no-display-prompt"]
        # the speculative loop stops once it has committed more than -n tokens: -n N - 1 commits N
        spec = ["-n", str(params.max_tokens - 1), "--spec-type", self.tool.spec_type, self.tool.k_flag, str(self.k)]
        if self.draft is not None:
            spec += ["-md", str(self.draft), "-td", str(self.threads)]
        return [*common, *spec]

    def generate(self, messages: Messages, prompt_ids: list[int] | None, params: SamplingParams) -> Outcome:
        assert prompt_ids is not None
        from augury.bench.runner import prompt_text

        prompt = prompt_text(self.tokenizer, messages, self.chat)
        with tempfile.TemporaryDirectory(prefix="augury-llama-cpp-") as tmp:
            prompt_file = Path(tmp) / "prompt.txt"
            # llama.cpp drops one trailing newline of a prompt file; this one, so the prompt keeps its own
            prompt_file.write_text(prompt + "\n", encoding="utf-8")
            stdout, stderr = run_llama_cpp(self.command(prompt_file, params))
        if self.tool.spec_type is None:
            timings = parse_completion_timings(stderr)
            answer, hit_eos = completion_answer(stdout)
        else:
            timings = parse_speculative_timings(stderr)
            answer, hit_eos = speculative_answer(stdout, prompt), False
        if timings.prompt_tokens != len(prompt_ids):
            raise AuguryError(
                f"{self.tool.binary} read the prompt as {timings.prompt_tokens} tokens, augury as {len(prompt_ids)}; "
                "the two would not run the same prompt"
            )
        tokens = self.tokenizer.encode(answer, add_bos=False)
        reason = "stop" if hit_eos or len(tokens) < params.max_tokens else "length"
        # The speculative loop commits whole blocks, so it may pass max_tokens by up to K tokens: its rate
        # counts them (they are in its decode time); the output is cut for comparison with augury's.
        counted = timings.committed if timings.committed and reason == "length" else len(tokens)
        if len(tokens) > params.max_tokens:
            tokens = tokens[: params.max_tokens]
            answer = self.tokenizer.decode(tokens)
        stats = SpecStats(
            prompt_tokens=timings.prompt_tokens,
            generated_tokens=counted,
            prefill_s=timings.prefill_s,
            total_s=timings.prefill_s + timings.decode_s,
            drafted=timings.drafted,
            accepted=timings.accepted,
        )
        if timings.committed:  # each verification commits its accepted drafts plus one token
            stats.steps = timings.committed - timings.accepted
            stats.target_forwards = stats.steps + 1
        return Outcome(tokens, answer, stats, reason)


def parse_llama_bench(stdout: str) -> dict[int, float]:
    """`llama-bench -o jsonl` results: each prompt-processing test (n_gen 0) as T -> ms per forward of T tokens."""
    out: dict[int, float] = {}
    for line in stdout.splitlines():
        if not line.lstrip().startswith("{"):
            continue
        try:
            test = json.loads(line)
        except json.JSONDecodeError:
            raise AuguryError(f"llama-bench printed a malformed result line: {line[:80]}") from None
        if test.get("n_gen") == 0 and test.get("n_prompt"):
            out[int(test["n_prompt"])] = float(test["avg_ns"]) / 1e6
    if not out:
        raise AuguryError("llama-bench printed no prompt-processing results; is it llama.cpp's llama-bench?")
    return out


def llama_bench_ms(
    binary: Path, gguf: Path, rows: list[int], *, depth: int, threads: int, repetitions: int = 3
) -> dict[int, float]:
    """llama.cpp's forward of T new tokens after `depth` cached ones (its pp T test), in ms, for each T."""
    command = [str(binary), "-m", str(gguf), "-t", str(threads), "-p", ",".join(map(str, rows)), "-n", "0",
               "-d", str(depth), "-r", str(repetitions), "-o", "jsonl", *repack_flags()]
    stdout, _ = run_llama_cpp(command)
    return parse_llama_bench(stdout)
