"""Service-level objectives for capacity search: `METRIC_STAT=SECONDS` limits on the run
summary (e.g. `ttft_p90=0.5`: the 90th-percentile TTFT is at most 0.5 s), plus an
optional attainment floor (DistServe: the fraction of requests whose own TTFT and TPOT
meet the ttft / tpot limits must be at least `attainment`)."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

# Latency metrics of summary.json (seconds) and their statistics.
METRICS = ("ttft", "tpot", "itl", "e2e", "queueing")
STATS = ("mean", "p50", "p90", "p99", "max")
# Per-request targets the scenario's `slo` block (and so `slo.attainment`) understands.
PER_REQUEST = ("ttft", "tpot")


@dataclass(frozen=True)
class SLOTarget:
    """`metric`'s `stat` (seconds) must be <= `limit_s`."""

    metric: str
    stat: str
    limit_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}_{self.stat}"

    @property
    def column(self) -> str:
        """The flat summary column, e.g. `ttft_s.p90`."""
        return f"{self.metric}_s.{self.stat}"


def known_slo_names() -> list[str]:
    return [f"{m}_{s}" for m in METRICS for s in STATS]


def parse_slo(text: str) -> SLOTarget:
    """`ttft_p90=0.5` -> SLOTarget("ttft", "p90", 0.5); ValueError names what is wrong."""
    if "=" not in text:
        raise ValueError(f"--slo expects METRIC_STAT=SECONDS (e.g. ttft_p90=0.5), got {text!r}")
    name, raw = (s.strip() for s in text.split("=", 1))
    metric, _, stat = name.lower().rpartition("_")
    metric = metric.removesuffix("_s")
    if metric not in METRICS or stat not in STATS:
        close = difflib.get_close_matches(name.lower(), known_slo_names(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"--slo {text!r}: unknown metric {name!r}{hint} (metrics: "
                         f"{', '.join(METRICS)}; statistics: {', '.join(STATS)}; e.g. ttft_p90)")
    try:
        limit = float(raw)
    except ValueError:
        raise ValueError(f"--slo {text!r}: the limit must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(limit) or limit <= 0:
        raise ValueError(f"--slo {text!r}: the limit must be > 0 seconds, got {raw!r}")
    return SLOTarget(metric, stat, limit)


@dataclass(frozen=True)
class SLOSet:
    """All targets must hold; with `attainment`, so must `slo.attainment >= attainment`."""

    targets: tuple[SLOTarget, ...]
    attainment: float | None = None

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("no SLO: give at least one --slo METRIC_STAT=SECONDS "
                             "(or an `slo:` block in the scenario)")
        if self.attainment is not None:
            if not 0 < self.attainment <= 1:
                raise ValueError(f"--attainment must be in (0, 1], got {self.attainment}")
            if not any(t.metric in PER_REQUEST for t in self.targets):
                raise ValueError("--attainment needs a ttft_* or tpot_* SLO: it counts the "
                                 "requests whose own TTFT / TPOT meet those limits")

    def per_request(self) -> dict[str, float]:
        """Scenario overrides (`slo.ttft_s`, `slo.tpot_s`): the tightest ttft / tpot limits,
        so that the summary's attainment and goodput count against them."""
        out: dict[str, float] = {}
        for t in self.targets:
            if t.metric in PER_REQUEST:
                key = f"slo.{t.metric}_s"
                out[key] = min(out.get(key, math.inf), t.limit_s)
        return out

    def check(self, metrics: dict[str, Any]) -> tuple[bool, list[str]]:
        """(all hold, the reasons they do not) for flat summary metrics."""
        reasons = []
        for t in self.targets:
            v = metrics.get(t.column)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                reasons.append(f"{t.name}: no finished requests")
            elif v > t.limit_s:
                reasons.append(f"{t.name} {v:.4g} s > {t.limit_s:g} s")
        if self.attainment is not None:
            a = metrics.get("slo.attainment") or 0.0
            if a < self.attainment:
                reasons.append(f"attainment {a:.3f} < {self.attainment:g}")
        return not reasons, reasons

    def describe(self) -> str:
        text = ", ".join(f"{t.name} <= {t.limit_s:g} s" for t in self.targets)
        if self.attainment is not None:
            text += f", attainment >= {self.attainment:g}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"targets": [{"name": t.name, "column": t.column, "limit_s": t.limit_s}
                            for t in self.targets], "attainment": self.attainment}


def slo_set(texts: list[str], attainment: float | None, scenario_slo: Any = None) -> SLOSet:
    """From --slo texts; with none, the scenario's `slo` block as per-request targets with
    an attainment floor (default 0.9, DistServe's usual choice)."""
    if texts:
        return SLOSet(tuple(parse_slo(t) for t in texts), attainment)
    targets = []
    if scenario_slo is not None:
        if scenario_slo.ttft_s is not None:
            targets.append(SLOTarget("ttft", "p90", scenario_slo.ttft_s))
        if scenario_slo.tpot_s is not None:
            targets.append(SLOTarget("tpot", "p90", scenario_slo.tpot_s))
    return SLOSet(tuple(targets), 0.9 if attainment is None and targets else attainment)
