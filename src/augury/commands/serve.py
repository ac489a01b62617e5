"""`augury serve`: an OpenAI-compatible HTTP server with continuous batching and speculative decoding."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import socket
import sys

from augury.commands.common import add_draft_args, add_model_args, load_from_args
from augury.errors import AuguryError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve an OpenAI-compatible API (continuous batching, speculative decoding)",
        description="Serve /v1/completions and /v1/chat/completions (streaming and not), /v1/models, /health, "
        "/metrics and /openapi.json. Concurrent requests share target forwards; the draft length adapts "
        "to the measured cost of verification, down to plain decoding when drafting does not pay.",
    )
    add_model_args(p)
    add_draft_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    g.add_argument(
        "--api-key",
        default=os.environ.get("AUGURY_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $AUGURY_API_KEY; none if unset)",
    )
    g.add_argument("--served-model-name", default=None, help="model id clients use (default: the --model value)")
    g.add_argument("--max-batch", type=int, default=16, help="sequences decoded together (default 16)")
    g.add_argument("--max-queue", type=int, default=64, help="requests waiting for a slot before 429 (default 64)")
    g.add_argument(
        "--queue-timeout", type=float, default=120.0, help="seconds a request may wait for a slot before 429 (default 120; 0 = no limit)"
    )
    g.add_argument(
        "--kv-budget-tokens",
        type=int,
        default=None,
        help="KV cache slots for all sequences together, split evenly between --max-batch rows "
        "(default: max batch x min(context, 4096))",
    )
    g.add_argument(
        "--prefix-cache-gb",
        default="0.25",
        metavar="GB",
        help="memory for K/V rows of earlier prompts and chats, reused by requests that start with the same "
        "tokens (least recently used evicted first; default 0.25; 0 disables)",
    )
    g.add_argument(
        "--prefill-chunk",
        default="auto",
        metavar="N|auto",
        help="prompt tokens one step may feed beside the running streams' decode rows, so a new prompt never "
        "stalls them for its whole prefill (default auto: the planner's budget from measured costs; 0: every "
        "prompt prefilled whole, alone, as it is admitted)",
    )
    g.add_argument(
        "--max-step-ms",
        type=float,
        default=None,
        metavar="MS",
        help="plan each step (decode rows, drafts and prompt pieces) to take at most MS milliseconds by the "
        "target's measured costs, a bound on every stream's time per output token: sequences past what fits "
        "wait in the queue (a longer time to first token under load); a step with no stream decoding feeds "
        "prompts at the full prefill budget. Default: no bound (up to --max-batch "
        "sequences at once, the most tokens per second)",
    )
    g.add_argument("--max-tokens-limit", type=int, default=4096, help="largest max_tokens a request may ask (default 4096)")
    g.add_argument("--max-prompt-tokens", type=int, default=None, help="longest prompt accepted (default: what fits)")
    g.add_argument("--max-body-bytes", type=int, default=2 * 1024 * 1024, help="largest request body (default 2 MiB)")
    g.add_argument("--max-prompt-chars", type=int, default=None,
                   help="longest prompt in characters, refused before tokenizing (default: 32 per prompt token)")
    g.add_argument("--max-messages", type=int, default=2048, help="most messages in one chat request (default 2048)")
    s = p.add_argument_group("security and lifecycle")
    s.add_argument("--allow-host", action="append", default=[], metavar="NAME[:PORT]",
                   help="accept requests whose Host header names this (repeatable; '*' = any). Default: only "
                   "127.0.0.1, localhost and [::1], plus the --host address when it is a specific one")
    s.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="let web pages from this origin (e.g. http://localhost:3000) call the API, with CORS headers "
                   "(repeatable; '*' = any). Default: browsers' cross-origin requests are refused")
    s.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a client may take to send a request's headers (default 10)")
    s.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a client may take to send a request body before 408 (default 30)")
    s.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="on SIGTERM or Ctrl-C, exit within this many seconds (default 30): new requests get 503 at "
                   "once, running ones may finish until min(5, T/2) s before the end, then end with an error")
    g.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="uvicorn log level (default info)")
    p.set_defaults(func=run_serve)


def _check_args(args: argparse.Namespace) -> None:
    if not 0 < args.port < 65536:
        raise AuguryError(f"--port must be between 1 and 65535, got {args.port}")
    _check_host(args.host, args.port)
    if args.api_key is not None:  # given (or $AUGURY_API_KEY set), so meant: an empty key would turn auth off
        if not args.api_key.strip():
            raise AuguryError("--api-key (or $AUGURY_API_KEY) is empty: give a key, or leave both out to serve "
                              "without one")
        if args.api_key != args.api_key.strip():
            raise AuguryError("--api-key starts or ends with whitespace, which no HTTP header can carry")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise AuguryError("--served-model-name is empty")
    if not args.queue_timeout >= 0:
        raise AuguryError(f"--queue-timeout must be >= 0 seconds (0 = no limit), got {args.queue_timeout}")
    for name in ("max_tokens_limit", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise AuguryError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_prompt_tokens is not None and args.max_prompt_tokens < 1:
        raise AuguryError(f"--max-prompt-tokens must be >= 1, got {args.max_prompt_tokens}")
    if args.api_key is not None and not args.api_key.isprintable():
        raise AuguryError("--api-key must be printable text")
    for name in ("max_prompt_chars", "max_messages"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise AuguryError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("header_timeout", "body_timeout", "shutdown_timeout"):
        if not getattr(args, name) >= (1.0 if name == "shutdown_timeout" else 0.1):
            raise AuguryError(f"--{name.replace('_', '-')} is too short: {getattr(args, name)} s")
    prefix_cache_bytes(args.prefix_cache_gb)
    prefill_chunk(args.prefill_chunk)
    max_step_ms(args.max_step_ms)
    for origin in args.allow_origin:
        if origin != "*" and not origin.startswith(("http://", "https://")):
            raise AuguryError(f"--allow-origin takes scheme://host[:port] (e.g. http://localhost:3000), got {origin!r}")


def _check_host(host: str, port: int) -> None:
    """--host must name an address to bind: an empty one (an unset $HOST, say) made uvicorn bind every
    interface, and a name that does not resolve failed only after the model had loaded."""
    if not host.strip():
        raise AuguryError("--host is empty: give an address to bind (127.0.0.1: this machine only; 0.0.0.0: "
                          "every interface)")
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise AuguryError(f"--host {host!r} is not an address this machine can bind ({exc})") from None


def prefill_chunk(text: str) -> int | None:
    """--prefill-chunk as SchedulerConfig.prefill_chunk: None for auto, else a whole number >= 0 (one-line errors)."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise AuguryError(f"--prefill-chunk takes a whole number of tokens or 'auto', got {text!r}") from None
    if value < 0:
        raise AuguryError(f"--prefill-chunk must be >= 0 (0 disables chunking), got {value}")
    return value


def max_step_ms(value: float | None) -> float | None:
    """--max-step-ms as SchedulerConfig.max_step_ms: None, or a finite number of milliseconds > 0 (one-line errors)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise AuguryError(f"--max-step-ms must be a positive number of milliseconds, got {value}")
    return value


def prefix_cache_bytes(text: str) -> int:
    """--prefix-cache-gb as bytes: a finite number of GB, >= 0, below this machine's memory (one-line errors)."""
    try:
        gb = float(text)
    except ValueError:
        raise AuguryError(f"--prefix-cache-gb takes a number of GB (0 disables it), got {text!r}") from None
    if not math.isfinite(gb) or gb < 0:
        raise AuguryError(f"--prefix-cache-gb must be a finite number of GB >= 0 (0 disables it), got {text!r}")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if gb * 2**30 >= memory:
        raise AuguryError(f"--prefix-cache-gb {text} is more than this machine's {memory / 2**30:.1f} GB of memory")
    return int(gb * 2**30)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return host == ""


def _allowed_hosts(args: argparse.Namespace) -> tuple[str, ...]:
    """--allow-host values plus the bound address when it is one specific address (clients then name it)."""
    hosts = list(args.allow_host)
    if not _is_wildcard(args.host) and not _is_loopback(args.host):
        hosts.append(f"[{args.host}]" if ":" in args.host else args.host)
    return tuple(hosts)


def run_serve(args: argparse.Namespace) -> int:
    _check_args(args)
    from augury.api import load
    from augury.engine import check_k
    from augury.scheduler import Scheduler, SchedulerConfig
    from augury.server import ServerConfig, create_app
    from augury.server.running import serve

    if args.draft_method != "plain":
        check_k(args.k)
    llm = load_from_args(args, load)
    target, proposer = llm.target, llm.proposer
    scheduler = Scheduler(
        target,
        proposer,
        SchedulerConfig(
            max_batch=args.max_batch,
            max_queue=args.max_queue,
            kv_budget_tokens=args.kv_budget_tokens,
            k=args.k,
            adaptive_k=not args.fixed_k,
            prefix_cache_bytes=prefix_cache_bytes(args.prefix_cache_gb),
            prefill_chunk=prefill_chunk(args.prefill_chunk),
            max_step_ms=max_step_ms(args.max_step_ms),
        ),
    )
    config = ServerConfig(
        model_name=args.served_model_name or args.model,
        api_key=args.api_key or None,
        max_body_bytes=args.max_body_bytes,
        max_tokens_limit=args.max_tokens_limit,
        max_prompt_tokens=args.max_prompt_tokens,
        queue_timeout=args.queue_timeout if args.queue_timeout > 0 else None,
        max_prompt_chars=args.max_prompt_chars,
        max_messages=args.max_messages,
        body_timeout=args.body_timeout,
        allowed_hosts=_allowed_hosts(args),
        allowed_origins=tuple(args.allow_origin),
    )
    app = create_app(target, scheduler, config)
    if not _is_loopback(args.host) and config.api_key is None:
        print(f"augury: warning: serving on {args.host} without --api-key; anyone who can reach it can use it",
              file=sys.stderr)
    if _is_wildcard(args.host) and not args.allow_host:
        print("augury: note: bound to every interface, but only requests with Host 127.0.0.1, localhost or [::1] "
              "are answered; add --allow-host NAME for the name clients use (or '*' behind a proxy that checks it)",
              file=sys.stderr)
    if args.kv_budget_tokens is not None and scheduler.capacity < args.kv_budget_tokens // args.max_batch:
        print(f"augury: note: --kv-budget-tokens {args.kv_budget_tokens} would give each of {args.max_batch} rows "
              f"{args.kv_budget_tokens // args.max_batch} tokens, more than the model's context: each holds "
              f"{scheduler.capacity}", file=sys.stderr)
    drafting = "plain decoding" if proposer is None else f"{args.draft_method} drafting, K up to {args.k}"
    if args.max_step_ms is not None:
        print(f"augury: steps planned within {args.max_step_ms:g} ms: {scheduler.seats} sequences at once by "
              "the measured costs now (it follows the costs as they are measured)", file=sys.stderr)
    print(
        f"augury: serving {config.model_name} ({drafting}) on http://{args.host}:{args.port} "
        f"with up to {args.max_batch} sequences of {scheduler.capacity} tokens",
        file=sys.stderr,
    )
    serve(app, args.host, args.port, shutdown_timeout=args.shutdown_timeout, header_timeout=args.header_timeout,
          log_level=args.log_level)
    return 0
