"""PNG plots of the serving suites from their latest records: latency against tokens (suite 1), against
documents (suite 2), throughput per variant (suite 3), and latency and throughput against concurrency
(suite 4). Drawn with matplotlib where it is installed; skipped, with a note, where it is not."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

Records = list[dict[str, Any]]


def plot_suites(latest_by_suite: dict[str, Records], output_dir: Path) -> dict[str, Path]:
    """suite -> the PNG drawn for it (only suites that have a plot and records for it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return {}
    output_dir.mkdir(parents=True, exist_ok=True)
    drawn = {}
    for suite, draw in PLOTS.items():
        records = latest_by_suite.get(suite)
        if not records:
            continue
        figure, axes = plt.subplots(1, 2, figsize=(11, 4))
        if not draw(records, axes):
            plt.close(figure)
            continue
        title = f"{suite}: {records[0]['gpu'] or 'CPU'}, commit {records[0]['commit']}, {records[0]['date']}"
        figure.suptitle(title)
        figure.tight_layout()
        path = output_dir / f"{suite}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        drawn[suite] = path
    return drawn


def _values(records: Records, metric: str) -> dict[str, dict[str, Any]]:
    return {record["case"]: record for record in records if record["metric"] == metric}


def _tokens(case: str) -> int:
    return int(re.findall(r"\d+", case)[-1])


def draw_latency(records: Records, axes) -> bool:
    p50 = _values(records, "latency_p50_ms")
    engine = {case: record for case, record in p50.items() if not case.startswith("http")}
    if not engine:
        return False
    cases = sorted(engine, key=_tokens)
    for ax, log in zip(axes, (False, True)):
        ax.plot([_tokens(c) for c in cases], [engine[c]["value"] for c in cases], "o-", label="posy engine")
        ax.plot(
            [_tokens(c) for c in cases],
            [engine[c]["baseline"] for c in cases],
            "s--",
            label="HF transformers (eager)",
        )
        for case in cases:
            ax.annotate(case, (_tokens(case), engine[case]["value"]), fontsize=7)
        http = [record for case, record in p50.items() if case.startswith("http")]
        for record in http:
            ax.plot(
                [_tokens(record["case"])], [record["value"]], "^", label=f"posy over HTTP ({record['case']})"
            )
        ax.set_xscale("log", base=2)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("tokens (batch 1)")
        ax.set_ylabel("p50 latency (ms)")
        ax.legend(fontsize=7)
    return True


def draw_scoring(records: Records, axes) -> bool:
    p50 = _values(records, "latency_p50_ms")
    if not p50:
        return False
    # the default path's 512-token pairs (not the shared-prefix comparison's cases)
    plotted = [case for case in p50 if case.endswith("x512")]
    models = sorted({case.rsplit("-", 1)[0] for case in plotted})
    for ax, model in zip(axes, models):
        cases = sorted(
            (case for case in plotted if case.startswith(model + "-")),
            key=lambda c: int(c.split("-")[-1].split("x")[0]),
        )
        documents = [int(case.split("-")[-1].split("x")[0]) for case in cases]
        ax.plot(documents, [p50[c]["value"] for c in cases], "o-", label="posy")
        ax.plot(documents, [p50[c]["baseline"] for c in cases], "s--", label="HF transformers")
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("documents (512-token pairs)")
        ax.set_ylabel("p50 latency (ms)")
        ax.legend(fontsize=7)
    return True


def draw_throughput(records: Records, axes) -> bool:
    rates = _values(records, "tokens_per_s")
    if not rates:
        return False
    cases = list(rates)
    positions = range(len(cases))
    axes[0].bar(
        [p - 0.2 for p in positions], [rates[c]["value"] / 1e6 for c in cases], 0.4, label="posy (HTTP)"
    )
    axes[0].bar(
        [p + 0.2 for p in positions],
        [(rates[c]["baseline"] or 0) / 1e6 for c in cases],
        0.4,
        label="HF transformers (in process)",
    )
    axes[0].set_xticks(list(positions), cases, fontsize=7)
    axes[0].set_ylabel("M tokens/s")
    axes[0].legend(fontsize=7)
    axes[1].bar(list(positions), [rates[c]["ratio"] or 0 for c in cases])
    axes[1].set_xticks(list(positions), cases, fontsize=7)
    axes[1].set_ylabel("posy / HF")
    return True


def draw_concurrency(records: Records, axes) -> bool:
    p50, p99 = _values(records, "latency_p50_ms"), _values(records, "latency_p99_ms")
    rate = _values(records, "requests_per_s")
    cases = sorted((case for case in p50 if case.startswith("clients-")), key=_tokens)
    if not cases:
        return False
    clients = [_tokens(case) for case in cases]
    axes[0].plot(clients, [rate[c]["value"] for c in cases if c in rate], "o-")
    axes[0].set_xlabel("concurrent clients")
    axes[0].set_ylabel("requests/s")
    axes[1].plot(clients, [p50[c]["value"] for c in cases], "o-", label="p50")
    axes[1].plot(clients, [p99[c]["value"] for c in cases if c in p99], "s--", label="p99")
    axes[1].set_xlabel("concurrent clients")
    axes[1].set_ylabel("latency (ms)")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.set_xscale("log", base=2)
    return True


PLOTS: dict[str, Callable[[Records, Any], bool]] = {
    "latency": draw_latency,
    "scoring": draw_scoring,
    "throughput": draw_throughput,
    "concurrency": draw_concurrency,
}
