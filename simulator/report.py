"""Text tables of run summaries: one column per run and, for two runs, their difference
(second minus first, absolute and relative)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

STATS4 = ("mean", "p50", "p90", "p99")
STATS2 = ("p50", "p99")


def _stats(key: str, stats: tuple[str, ...], scale: float) -> Callable[[dict], list]:
    return lambda s: [None if s[key].get(k) is None else s[key][k] * scale for k in stats]


# (label, values of a summary, decimals)
ROWS: list[tuple[str, Callable[[dict], list], int]] = [
    ("requests finished", lambda s: [s["requests"]["finished"]], 0),
    ("requests total", lambda s: [s["requests"]["total"]], 0),
    ("rejected", lambda s: [s["requests"]["rejected"]], 0),
    ("throughput (output tok/s)", lambda s: [s["throughput"]["output_tokens_per_s"]], 1),
    ("throughput (req/s)", lambda s: [s["throughput"]["requests_per_s"]], 3),
    ("TTFT mean / p50 / p90 / p99 (ms)", _stats("ttft_s", STATS4, 1e3), 1),
    ("TPOT mean / p50 / p90 / p99 (ms)", _stats("tpot_s", STATS4, 1e3), 1),
    ("ITL p50 / p99 (ms)", _stats("itl_s", STATS2, 1e3), 1),
    ("E2E mean / p50 / p90 / p99 (s)", _stats("e2e_s", STATS4, 1.0), 2),
    ("queueing p50 / p99 (ms)", _stats("queueing_s", STATS2, 1e3), 1),
    ("SLO attainment", lambda s: [s["slo"]["attainment"]], 3),
    ("goodput (req/s)", lambda s: [s["slo"]["goodput_rps"]], 3),
    ("KV peak usage", lambda s: [s["kv"]["peak_usage"]], 3),
    ("prefix hit rate", lambda s: [s["kv"]["prefix_hit_rate"]], 3),
    ("preemptions", lambda s: [s["preemptions"]], 0),
    ("simulated span (s)", lambda s: [s["span_s"]], 1),
    ("wall time (s)", lambda s: [s["wall_s"]], 2),
]


def _cell(values: list[Any], digits: int, sign: bool = False) -> str:
    fmt = f"{{:{'+' if sign else ''}.{digits}f}}"
    return " / ".join("-" if v is None else fmt.format(v) for v in values)


def _rel(a: list[Any], b: list[Any]) -> str:
    out = []
    for x, y in zip(a, b):
        if x is None or y is None:
            out.append("-")
        elif x == 0:
            out.append("0%" if y == 0 else "n/a")
        else:
            out.append(f"{(y - x) / abs(x) * 100:+.1f}%")
    return " / ".join(out)


def summary_table(summaries: list[dict], names: list[str]) -> str:
    """A fixed-width table, one column per summary; with two summaries also the columns
    `diff` (second - first) and `diff %` (relative to the first)."""
    header = ["metric", *names]
    compare = len(summaries) == 2
    if compare:
        header += ["diff", "diff %"]
    cells = []
    for label, values, digits in ROWS:
        vals = [values(s) for s in summaries]
        row = [label] + [_cell(v, digits) for v in vals]
        if compare:
            a, b = vals
            d = [None if x is None or y is None else y - x for x, y in zip(a, b)]
            row += [_cell(d, digits, sign=True), _rel(a, b)]
        cells.append(row)
    widths = [max(len(str(r[i])) for r in cells + [header]) for i in range(len(header))]
    line = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in cells])
