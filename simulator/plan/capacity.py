"""Capacity search: the highest request rate at which a scenario meets its SLOs.

The scenario's trace is rescaled to a rate (`workload.target_rate`, requests/s; the
arrival pattern keeps its shape) and simulated. The search brackets the boundary by
doubling / halving from the trace's own rate, bisects (geometric midpoints) until the
bracket is within `rel_tol`, then checks that a rate `verify_step` higher fails; if it
passes (latency is not always monotone in load), the search continues from there. So
the answer R always meets the SLOs and R x (1 + verify_step) does not.

Confidence: the boundary is re-simulated on other samples of the traffic: other seeds
for a synthetic workload, other windows of the same length for a windowed trace. A plain
trace replay is deterministic and gets no repeats (the note says so).
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from simulator.plan.keys import BaseScenario
from simulator.plan.slo import SLOSet
from simulator.plan.worker import PointTask, simulate

# Bracketing stops after this many doublings / halvings of the start rate (x4096 / /1024).
MAX_DOUBLINGS = 12
MAX_HALVINGS = 10
# Rates are rounded to this many significant digits so a reported rate re-simulates exactly.
RATE_DIGITS = 6
# Summary columns kept for each evaluation (besides the SLO metrics).
KEEP = ("slo.attainment", "slo.goodput_rps", "throughput.output_tokens_per_s",
        "throughput.requests_per_s", "requests.total", "requests.finished", "requests.rejected",
        "ttft_s.p90", "tpot_s.p90", "e2e_s.p90", "cost.gpus", "cost.usd_per_hour",
        "cost.usd_per_m_output_tokens")


def round_rate(rate: float) -> float:
    return float(f"{rate:.{RATE_DIGITS}g}")


@dataclass
class Probe:
    """Simulates one candidate scenario at a rate (and replay variant), with a cache."""

    base: BaseScenario
    overrides: dict[str, Any]
    slos: SLOSet
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    _cache: dict[tuple[float, int], dict[str, Any]] = field(default_factory=dict)
    variants: list[dict[str, Any]] = field(default_factory=list)  # replay overrides, [0] = base
    timeout_s: float | None = None  # wall-clock limit per simulation, seconds
    progress_name: str | None = None  # print a stderr line per simulation under this name

    def metrics(self, rate: float, variant: int = 0) -> dict[str, Any]:
        key = (round_rate(rate), variant)
        if key not in self._cache:
            overrides = {**self.overrides, **(self.variants[variant] if self.variants else {}),
                         **self.slos.per_request(), "workload.target_rate": key[0]}
            task = PointTask("", self.base, overrides, self.timeout_s)
            self._cache[key] = m = simulate(task)
            ok, reasons = self.slos.check(m)
            kept = {k: m.get(k) for k in (*KEEP, *(t.column for t in self.slos.targets))}
            self.evaluations.append({"rate": key[0], "variant": variant, "ok": ok,
                                     "reasons": reasons, "metrics": kept})
            if self.progress_name is not None:
                sample = "" if variant == 0 else f" (traffic sample {variant})"
                verdict = "meets the SLOs" if ok else "; ".join(reasons)
                print(f"  {self.progress_name}: simulation {len(self._cache)} at {key[0]:.4g} "
                      f"req/s{sample}: {verdict}", file=sys.stderr, flush=True)
        return self._cache[key]

    def ok(self, rate: float, variant: int = 0) -> bool:
        return self.slos.check(self.metrics(rate, variant))[0]

    @property
    def num_simulations(self) -> int:
        return len(self._cache)


@dataclass
class SearchResult:
    max_rate: float | None  # requests/s; None: the SLOs fail even at the lowest rate tried
    fail_rate: float | None  # the lowest failing rate found above max_rate
    start_rate: float
    num_simulations: int
    wall_s: float
    note: str = ""
    confidence: dict[str, Any] = field(default_factory=dict)


def trace_rate(base: BaseScenario, overrides: dict[str, Any]) -> tuple[float, float]:
    """(mean rate in requests/s, duration in s) of the scenario's trace after its transforms."""
    from simulator.run import build_trace
    from workloads.transforms import mean_rate

    trace = build_trace(base.build(overrides))
    return mean_rate(trace), float(trace.duration_s)


def replay_variants(base: BaseScenario, overrides: dict[str, Any],
                    repeats: int) -> tuple[list[dict], str]:
    """Overrides for `repeats` other samples of the traffic, and what they are."""
    sc = base.build(overrides)
    w = sc.workload
    if repeats <= 0:
        return [], "no repeats asked"
    if w.synthetic:
        seed = sc.seed if w.seed is None else w.seed
        return ([{"workload.seed": seed + i} for i in range(1, repeats + 1)],
                f"synthetic workload, seeds {seed + 1}..{seed + repeats}")
    if w.trace and w.window_s is not None:
        start, end = w.window_s
        length = end - start
        full = {**overrides, "workload.window_s": None, "workload.limit": None,
                "workload.target_rate": None, "workload.rate_scale": None}
        _, duration = trace_rate(base, full)
        starts = [start + i * length for i in range(1, repeats + 1)
                  if start + (i + 1) * length <= duration]
        starts += [start - i * length for i in range(1, repeats + 1) if start - i * length >= 0]
        starts = starts[:repeats]
        if starts:
            return ([{"workload.window_s": [s, s + length]} for s in starts],
                    f"other {length:g} s windows of the trace starting at "
                    f"{', '.join(f'{s:g}' for s in starts)} s")
        return [], "the trace has no other window of this length; replay is deterministic"
    return [], "a trace replay is deterministic (no seed changes it); no repeats"


def search(probe: Probe, start_rate: float, *, rel_tol: float = 0.02, verify_step: float = 0.1,
           max_simulations: int = 60, variant: int = 0, factor: float = 2.0) -> SearchResult:
    """Bracket (steps of `factor`), bisect and verify the highest passing rate on replay
    `variant` (see the module docstring); at most `max_simulations` new simulations."""
    t0 = time.perf_counter()
    if not rel_tol > 0 or not verify_step > rel_tol or not factor > 1 + rel_tol:
        raise ValueError(f"need rel_tol > 0, verify_step > rel_tol and factor > 1 + rel_tol, "
                         f"got {rel_tol}, {verify_step}, {factor}")
    limit = probe.num_simulations + max_simulations
    lo, hi = _bracket(probe, round_rate(start_rate), variant, factor)
    note = ""
    if lo is None:
        ev = probe.evaluations[-1]
        return SearchResult(None, hi, start_rate, probe.num_simulations, time.perf_counter() - t0,
                            f"the SLOs fail even at {hi:.4g} req/s: {'; '.join(ev['reasons'])}")
    while True:
        while hi / lo > 1 + rel_tol and probe.num_simulations < limit:
            mid = round_rate(math.sqrt(lo * hi))
            if mid in (lo, hi):
                break
            lo, hi = (mid, hi) if probe.ok(mid, variant) else (lo, mid)
        if probe.num_simulations >= limit:
            note = f"stopped at the limit of {max_simulations} simulations; bracket [{lo:.4g}, {hi:.4g}]"
            break
        above = round_rate(lo * (1 + verify_step))
        if not probe.ok(above, variant):
            break
        # Not monotone: a higher rate passes again; search on from there.
        note = f"latency was not monotone in load: {above:.4g} req/s passed after {hi:.4g} failed"
        lo, hi = _bracket(probe, above, variant, factor)
        if lo is None:  # cannot happen (above passed); kept for type narrowing
            break
    return SearchResult(lo, hi, start_rate, probe.num_simulations, time.perf_counter() - t0, note)


def _bracket(probe: Probe, start: float, variant: int = 0,
             factor: float = 2.0) -> tuple[float | None, float]:
    """(passing rate, failing rate) with failing <= factor x passing; (None, lowest tried)
    if nothing passes down to start / factor^MAX_HALVINGS."""
    if probe.ok(start, variant):
        lo = start
        for _ in range(MAX_DOUBLINGS):
            hi = round_rate(lo * factor)
            if not probe.ok(hi, variant):
                return lo, hi
            lo = hi
        raise ValueError(f"the SLOs still hold at {lo:.4g} req/s ({factor:g}^{MAX_DOUBLINGS} x "
                         f"{start:.4g}): the rate does not bind. A finite trace arriving all "
                         f"at once still meets these limits; use a longer trace / window or "
                         f"tighter limits")
    hi = start
    for _ in range(MAX_HALVINGS):
        lo = round_rate(hi / factor)
        if probe.ok(lo, variant):
            return lo, hi
        hi = lo
    return None, hi


def confidence(probe: Probe, result: SearchResult, what: str, *, rel_tol: float = 0.05,
               verify_step: float = 0.1, max_simulations: int = 20) -> dict[str, Any]:
    """The same search, coarser (`rel_tol`, steps of 1.25x from the answer), on every
    replay variant: how far the highest passing rate moves with the traffic sample."""
    n = len(probe.variants) - 1
    out: dict[str, Any] = {"replays": n, "what": what}
    if result.max_rate is None or n <= 0:
        out["note"] = f"no confidence replays: {what}"
        return out
    rates: list[float | str | None] = []  # None: fails at every rate tried
    for v in range(1, n + 1):
        try:
            rates.append(search(probe, result.max_rate, rel_tol=rel_tol, verify_step=verify_step,
                                max_simulations=max_simulations, variant=v,
                                factor=1.25).max_rate)
        except ValueError:  # the rate does not bind on this sample
            rates.append("unbounded")
    held = sum(probe.ok(result.max_rate, v) for v in range(1, n + 1))
    numbers = [r for r in rates if isinstance(r, float)]
    low = min(numbers) if numbers and None not in rates else None
    out.update(max_rates=rates, held_at_max=held, min_rate_rps=low)
    shown = ", ".join("none" if r is None else r if isinstance(r, str) else f"{r:.4g}"
                      for r in rates)
    if held == n:
        verdict = "so the answer holds on every sample"
    elif low is not None:
        verdict = f"plan for {low:.4g} req/s to meet the SLOs on every sample"
    else:
        verdict = "some samples meet the SLOs at no rate tried: plan well below the answer"
    out["note"] = (f"checked on {n} other samples of the traffic ({what}): their highest passing "
                   f"rates are {shown} req/s; {result.max_rate:.4g} req/s met the SLOs on {held} "
                   f"of the {n}; {verdict}")
    return out
