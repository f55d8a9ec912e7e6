"""Text tables of run summaries (one column per run)."""

from __future__ import annotations

ROWS = [
    ("requests (finished/total)", lambda s: f"{s['requests']['finished']}/{s['requests']['total']}"),
    ("rejected", lambda s: f"{s['requests']['rejected']}"),
    ("throughput (output tok/s)", lambda s: f"{s['throughput']['output_tokens_per_s']:.1f}"),
    ("throughput (req/s)", lambda s: f"{s['throughput']['requests_per_s']:.3f}"),
    ("TTFT mean / p50 / p90 / p99 (ms)", lambda s: _ms(s["ttft_s"])),
    ("TPOT mean / p50 / p90 / p99 (ms)", lambda s: _ms(s["tpot_s"])),
    ("ITL p50 / p99 (ms)", lambda s: _ms(s["itl_s"], ("p50", "p99"))),
    ("E2E mean / p50 / p90 / p99 (s)", lambda s: _s(s["e2e_s"])),
    ("queueing p50 / p99 (ms)", lambda s: _ms(s["queueing_s"], ("p50", "p99"))),
    ("SLO attainment", lambda s: f"{s['slo']['attainment']:.3f}"),
    ("goodput (req/s)", lambda s: f"{s['slo']['goodput_rps']:.3f}"),
    ("KV peak usage", lambda s: f"{s['kv']['peak_usage']:.3f}"),
    ("prefix hit rate", lambda s: f"{s['kv']['prefix_hit_rate']:.3f}"),
    ("preemptions", lambda s: f"{s['preemptions']}"),
    ("simulated span (s)", lambda s: f"{s['span_s']:.1f}"),
    ("wall time (s)", lambda s: f"{s['wall_s']:.2f}"),
]


def _fmt(stats: dict, keys, scale: float, digits: int) -> str:
    vals = [stats.get(k) for k in keys]
    return " / ".join("-" if v is None else f"{v * scale:.{digits}f}" for v in vals)


def _ms(stats: dict, keys=("mean", "p50", "p90", "p99")) -> str:
    return _fmt(stats, keys, 1e3, 1)


def _s(stats: dict, keys=("mean", "p50", "p90", "p99")) -> str:
    return _fmt(stats, keys, 1.0, 2)


def summary_table(summaries: list[dict], names: list[str]) -> str:
    """A fixed-width table, one column per summary."""
    cells = [[label] + [fn(s) for s in summaries] for label, fn in ROWS]
    header = ["metric"] + names
    widths = [max(len(str(r[i])) for r in cells + [header]) for i in range(len(header))]
    line = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in cells])
