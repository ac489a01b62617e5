"""The benchmark report: summary.md, PNG plots and one self-contained report.html.

Every table is built once as data (`Table`) and rendered to both Markdown and
HTML, so the two never disagree. A report from an unfinished run says so at
the top of each file and in each plot's title ("INCOMPLETE: n of m runs").
"""

from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import dataclass
from pathlib import Path

from augury.bench.records import PLOTS, RECORDS, REPORT_HTML, RUN_INFO, SUMMARY_MD, read_records
from augury.bench.summary import OVERALL, Summary, summarize
from augury.errors import AuguryError

DEFINITIONS = (
    "tokens/s = Σ generated tokens ÷ Σ decode seconds (wall time after each generation's first token); "
    "e2e tok/s: ÷ Σ whole wall time, prefill included. llama.cpp peers are timed by llama.cpp itself.",
    "speed-up = a method's tokens/s ÷ plain decoding's tokens/s over the prompts both finished in this same "
    "run (interleaved prompt by prompt); per task over that task's prompts, overall over all of them "
    "(a ratio of sums, not a mean of task speed-ups). e2e: the same with whole wall time, prefill included.",
    "τ = tokens committed per target verification forward, the recovered or bonus token included (plain = 1); "
    "α = accepted ÷ drafted; acceptance at position i = accepted ÷ drafted at draft position i.",
    "= plain: greedy outputs identical to plain decoding's token ids for the same prompt (lossless methods must "
    "be; peers run other kernels, so bf16 near-ties may differ there).",
)
TIME_PARTS = ("prefill_s", "draft_s", "verify_s", "other_s")  # where a run's wall time went (`SpecStats`)


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.headers) + " |"]
        lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.headers))) + "|")
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self.rows)
        table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return f"<h3>{html.escape(self.title)}</h3>\n{table}\n"


def _f(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{suffix}"


def tables(s: Summary) -> list[Table]:
    """Every table of the report, in order."""
    out = []
    rows = []
    for task in [*s.tasks, OVERALL]:
        for key in s.keys:
            agg = s.cell(task, key)
            if agg is None:
                continue
            rows.append([
                task, s.labels[key], str(agg.runs), str(agg.stats.generated_tokens), _f(agg.tokens_per_s),
                _f(agg.speedup, ".2f", "x"), _f(agg.tau), _f(agg.alpha),
            ])
    headers = ["task", "method", "prompts", "tokens", "tok/s", "speed-up", "τ", "α"]
    out.append(Table("Per task and overall", headers, rows))

    rows = []
    for key in s.keys:
        agg = s.cell(OVERALL, key)
        if agg is None:
            continue
        total = agg.stats.total_s or 1.0
        same = s.compared.get(key)
        rows.append([
            s.labels[key], s.kinds[key], _f(agg.tokens_per_s), _f(agg.tokens_per_s_e2e), _f(agg.speedup, ".2f", "x"),
            _f(agg.speedup_e2e, ".2f", "x"), _f(agg.slowest, ".2f", "x"), _f(agg.ttft_s * 1000, ".0f"),
            _f(agg.tpot_s * 1000, ".1f"), f"{same[0]}/{same[1]}" if same else "—",
            *(f"{100 * getattr(agg.stats, part) / total:.0f}%" for part in TIME_PARTS),
        ])
    out.append(Table(
        "Overall: speed, latency, correctness and where the time went",
        ["method", "kind", "tok/s", "e2e tok/s", "speed-up", "e2e speed-up", "slowest prompt", "TTFT ms", "TPOT ms",
         "= plain",
         "prefill", "draft", "verify", "other"],
        rows,
    ))

    drafting = [key for key in s.keys if (agg := s.cell(OVERALL, key)) is not None and agg.stats.drafted_at]
    if drafting:
        width = max(len(s.cell(OVERALL, key).acceptance_by_position) for key in drafting)
        rows = []
        for key in drafting:
            by_pos = s.cell(OVERALL, key).acceptance_by_position
            rows.append([s.labels[key], *(_f(by_pos[i]) if i < len(by_pos) else "—" for i in range(width))])
        headers = ["method", *(str(i + 1) for i in range(width))]
        out.append(Table("Acceptance by draft position (overall)", headers, rows))

    if s.sweep:
        rows = [[method, str(k), _f(speedup, ".2f", "x"), _f(tau)] for method, points in s.sweep.items()
                for k, speedup, tau in points]
        out.append(Table("Sweep over K (overall)", ["method", "K", "speed-up", "τ"], rows))

    if s.peers:
        rows = [[p.peer, _f(p.peer_tokens_per_s), _f(p.peer_tokens_per_s_e2e), p.counterpart or "—",
                 _f(p.counterpart_ratio, ".2f", "x"), _f(p.counterpart_ratio_e2e, ".2f", "x"), p.best,
                 _f(p.best_ratio, ".2f", "x")] for p in s.peers]
        out.append(Table(
            "augury against peers (augury tok/s ÷ peer tok/s on the prompts both ran)",
            ["peer", "peer tok/s", "peer e2e tok/s", "augury counterpart", "ratio", "e2e ratio", "augury fastest",
             "ratio"],
            rows,
        ))

    if s.mismatches:
        rows = [[m.prompt_id, s.labels.get((m.method, m.k), m.method), str(m.turn + 1), str(m.position),
                 "end" if m.token is None else str(m.token), "end" if m.plain_token is None else str(m.plain_token)]
                for m in s.mismatches]
        out.append(Table("Outputs that differ from plain greedy decoding",
                         ["prompt", "method", "turn", "first differing position", "token", "plain token"], rows))
    return out


def settings_lines(s: Summary) -> list[str]:
    info = s.info
    fields = [("model", "model"), ("draft", "draft"), ("suite", "suite"), ("data", "data"), ("turns", "turns"),
              ("max new tokens", "max_new_tokens"), ("temperature", "temperature"), ("sampling", "sampling"),
              ("seed", "seed"), ("K", "k"),
              ("dtype", "dtype"), ("device", "device"), ("started", "started")]
    lines = [f"{label}: {info[key]}" for label, key in fields if info.get(key) is not None]
    machine = info.get("machine") or {}
    if machine:
        lines.append("machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()))
    lines.extend(info.get("notes", []))
    return lines


# -- plots -------------------------------------------------------------------------------


def _figure():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _title(s: Summary, text: str) -> str:
    return text if s.complete else f"{text}\n({s.status})"


def plot_speedup(s: Summary):
    """Grouped bars: speed-up over plain per task (and overall), one bar per method."""
    keys = [
        key for key in s.keys
        if key[0] != "plain" and any((agg := s.cell(t, key)) is not None and agg.speedup for t in s.tasks)
    ]
    if not keys:
        return None
    plt = _figure()
    groups = [*s.tasks, OVERALL]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * max(1, len(keys)) ** 0.5 + 2), 4.2))
    width = 0.8 / len(keys)
    for j, key in enumerate(keys):
        values = [(s.cell(t, key).speedup or 0.0) if s.cell(t, key) else 0.0 for t in groups]
        xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(groups))]
        bars = ax.bar(xs, values, width, label=s.labels[key])
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)), groups, rotation=20, ha="right")
    ax.set_ylabel("speed-up over plain decoding (x)")
    ax.set_title(_title(s, "Speed-up per task"))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_acceptance(s: Summary):
    """Acceptance rate at each draft position, one line per drafting method."""
    keys = [key for key in s.keys if (agg := s.cell(OVERALL, key)) is not None and agg.stats.drafted_at]
    if not keys:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in keys:
        by_pos = s.cell(OVERALL, key).acceptance_by_position
        ax.plot(range(1, len(by_pos) + 1), by_pos, marker="o", label=s.labels[key])
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    ax.set_title(_title(s, "Acceptance by draft position"))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_time_split(s: Summary):
    """Stacked bars: share of wall time in prefill, drafting, verification and the rest."""
    keys = [key for key in s.keys if s.cell(OVERALL, key) is not None and s.kinds[key] == "augury"]
    if not keys:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6.5, 0.5 * len(keys) + 2.2))
    left = [0.0] * len(keys)
    for part in TIME_PARTS:
        shares = [getattr(s.cell(OVERALL, k).stats, part) / (s.cell(OVERALL, k).stats.total_s or 1.0) for k in keys]
        ax.barh(range(len(keys)), shares, left=left, label=part.removesuffix("_s"))
        left = [a + b for a, b in zip(left, shares)]
    ax.set_yticks(range(len(keys)), [s.labels[k] for k in keys])
    ax.set_xlabel("share of wall time")
    ax.set_xlim(0, 1)
    ax.set_title(_title(s, "Where the time went"))
    ax.legend(fontsize=8, ncols=4, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    fig.tight_layout()
    return fig


def plot_sweep(s: Summary):
    """Speed-up and τ against K, one line per drafting method."""
    if not s.sweep:
        return None
    plt = _figure()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for method, points in s.sweep.items():
        ks = [k for k, _, _ in points]
        ax1.plot(ks, [v or 0.0 for _, v, _ in points], marker="o", label=method)
        ax2.plot(ks, [t or 0.0 for _, _, t in points], marker="o", label=method)
    ax1.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax1.set_xlabel("K (draft length)")
    ax1.set_ylabel("speed-up over plain (x)")
    ax2.set_xlabel("K (draft length)")
    ax2.set_ylabel("τ (tokens per target forward)")
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
    fig.suptitle(_title(s, "Sweep over K"))
    fig.tight_layout()
    return fig


PLOTTERS = dict(zip(PLOTS, (plot_speedup, plot_acceptance, plot_time_split, plot_sweep)))


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


# -- files ---------------------------------------------------------------------------------


def render_markdown(s: Summary, plots: list[str]) -> str:
    parts = [f"# augury bench: {s.info.get('suite', '')}", ""]
    if not s.complete:
        parts += [f"> **{s.status}** — this report covers only the runs that finished.", ""]
    parts += [f"- {line}" for line in settings_lines(s)] + [""]
    parts += [t.markdown() for t in tables(s)]
    if s.greedy and not s.mismatches and s.compared:
        which = "greedy" if float(s.info.get("temperature", 0.0)) == 0.0 else "seeded, coupled-sampled"
        parts.append(f"All compared {which} outputs are identical to plain decoding's.\n")
    if not s.greedy:
        parts.append(f"Sampled run (temperature {s.info.get('temperature')}): outputs differ by design and are "
                     "not compared with plain decoding.\n")
    parts += ["### Definitions", "", *(f"- {d}" for d in DEFINITIONS), ""]
    parts += [f"![{name}]({name})" for name in plots]
    return "\n".join(parts) + "\n"


def render_html(s: Summary, images: dict[str, bytes]) -> str:
    title = f"augury bench: {s.info.get('suite', '')}"
    banner = (
        f'<p class="incomplete">{html.escape(s.status)} — this report covers only the runs that finished.</p>'
        if not s.complete else ""
    )
    settings = "".join(f"<li>{html.escape(line)}</li>" for line in settings_lines(s))
    body = "".join(t.html() for t in tables(s))
    defs = "".join(f"<li>{html.escape(d)}</li>" for d in DEFINITIONS)
    figures = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,{base64.b64encode(data).decode()}"></figure>'
        for name, data in images.items()
    )
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse;margin-bottom:1.5em}th,td{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}td:first-child,th:first-child{text-align:left}"
        ".incomplete{background:#fdd;border:2px solid #c00;padding:.6em;font-weight:bold}img{max-width:100%}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>{banner}<ul>{settings}</ul>"
        f"{body}<h3>Definitions</h3><ul>{defs}</ul>{figures}</body></html>\n"
    )


def load_summary(out: Path) -> Summary:
    info_path = out / RUN_INFO
    if not info_path.exists():
        raise AuguryError(f"{out}: no {RUN_INFO}; not a benchmark folder")
    return summarize(read_records(out / RECORDS), json.loads(info_path.read_text()))


def write_report(out: Path) -> Summary:
    """(Re)build summary.md, the plots and report.html from out/records.jsonl and out/run.json."""
    s = load_summary(out)
    images: dict[str, bytes] = {}
    for name, plotter in PLOTTERS.items():
        fig = plotter(s)
        path = out / name
        if fig is None:
            path.unlink(missing_ok=True)
            continue
        images[name] = _png(fig)
        path.write_bytes(images[name])
    (out / SUMMARY_MD).write_text(render_markdown(s, list(images)), encoding="utf-8")
    (out / REPORT_HTML).write_text(render_html(s, images), encoding="utf-8")
    return s


def console_summary(s: Summary) -> str:
    """A few lines for the terminal: overall tokens/s, speed-up and τ per method."""
    lines = [] if s.complete else [s.status]
    for key in s.keys:
        agg = s.cell(OVERALL, key)
        if agg is None:
            continue
        lines.append(
            f"{s.labels[key]:>22}: {agg.tokens_per_s:7.2f} tok/s (e2e {agg.tokens_per_s_e2e:6.2f})"
            f"  speed-up {_f(agg.speedup, '.2f', 'x'):>6}"
            f"  tau {_f(agg.tau):>5}  alpha {_f(agg.alpha):>5}"
        )
    if s.mismatches:
        lines.append(f"{len(s.mismatches)} greedy output(s) differ from plain decoding (see summary.md)")
    return "\n".join(lines)
