"""/metrics in the Prometheus text format, from the scheduler's counters."""

from __future__ import annotations

from collections import Counter

from augury.scheduler import Scheduler


def render(scheduler: Scheduler, responses: Counter) -> str:
    """Counters, gauges and speculation quality (tau, alpha) as Prometheus exposition text."""
    s = scheduler.stats
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP augury_{name} {help_text}")
        lines.append(f"# TYPE augury_{name} {kind}")
        for labels, value in samples:
            lines.append(f"augury_{name}{labels} {value!r}")

    metric("requests_total", "counter", "Generation requests by outcome.", [
        ('{outcome="completed"}', s.completed),
        ('{outcome="cancelled"}', s.cancelled),
        ('{outcome="failed"}', s.failed),
        ('{outcome="rejected"}', s.rejected),
    ])
    metric("http_responses_total", "counter", "HTTP responses by status code.",
           [(f'{{code="{code}"}}', count) for code, count in sorted(responses.items())])
    metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests (prefilled or read from the prefix "
           "cache).", [("", s.prompt_tokens)])
    metric("generated_tokens_total", "counter", "Tokens generated.", [("", s.generated_tokens)])
    metric("drafted_tokens_total", "counter", "Tokens proposed by the drafter.", [("", s.drafted)])
    metric("accepted_tokens_total", "counter", "Drafted tokens the target accepted.", [("", s.accepted)])
    metric("steps_total", "counter", "Batched verification forwards of the target.", [("", s.steps)])
    metric("sequence_steps_total", "counter", "Sequences advanced by those forwards (divided by steps_total: the "
           "mean batch).", [("", s.sequence_steps)])
    metric("queue_length", "gauge", "Requests waiting for a slot.", [("", scheduler.queue_length)])
    metric("running", "gauge", "Requests holding a slot.", [("", scheduler.running)])
    metric("seats", "gauge", "Requests that may hold a slot at once: --max-batch, fewer where --max-step-ms bounds "
           "a step's rows by the measured costs.", [("", scheduler.seats)])
    metric("tau", "gauge", "Mean tokens committed per sequence per verification step.", [("", float(s.tau))])
    metric("alpha", "gauge", "Fraction of drafted tokens accepted.", [("", float(s.alpha))])
    metric("draft_length", "gauge", "Draft length K of the last step.", [("", s.last_k)])
    metric("drafting_seconds_total", "counter", "Seconds spent drafting.", [("", float(s.draft_s))])
    metric("verification_seconds_total", "counter", "Seconds in batched target forwards and verification.",
           [("", float(s.verify_s))])
    metric("prefill_seconds_total", "counter", "Seconds spent prefilling prompts (for prompts fed in pieces, "
           "their rows' share of each step).", [("", float(s.prefill_s))])
    metric("prompts_in_pieces_total", "counter", "Prompts prefilled in pieces inside the decode steps.",
           [("", s.prompts_in_pieces)])
    metric("prefilling", "gauge", "Admitted requests whose prompt is still being prefilled.",
           [("", scheduler.prefilling)])
    caches = [(f'{{model="{name}"}}', cache) for name, cache in (("target", scheduler.prefix),
              ("drafter", scheduler.draft_prefix)) if cache is not None]
    metric("prefix_cache_hits_total", "counter", "Prompts that started on rows of the prefix cache.",
           [(labels, c.hits) for labels, c in caches])
    metric("prefix_cache_misses_total", "counter", "Prompts the prefix cache held no start of.",
           [(labels, c.misses) for labels, c in caches])
    metric("prefix_cache_saved_tokens_total", "counter", "Prompt tokens read from the prefix cache instead of "
           "prefilled.", [(labels, c.saved_tokens) for labels, c in caches])
    metric("prefix_cache_evictions_total", "counter", "Prefix cache blocks evicted to stay in the budget.",
           [(labels, c.evictions) for labels, c in caches])
    metric("prefix_cache_bytes", "gauge", "Bytes of K/V rows the prefix cache holds.",
           [(labels, c.bytes) for labels, c in caches])
    metric("prefix_cache_budget_bytes", "gauge", "The prefix cache's budget in bytes.",
           [(labels, c.budget) for labels, c in caches])
    metric("prefix_cache_reserved_bytes", "gauge", "Memory the prefix cache took at start (its budget's whole "
           "blocks), held whether or not rows fill it.", [(labels, c.reserved) for labels, c in caches])
    return "\n".join(lines) + "\n"
