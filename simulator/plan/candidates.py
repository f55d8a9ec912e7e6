"""Capacity planning: run the capacity search for each candidate (hardware x P:D ratio),
in parallel, and turn each answer into replicas, accelerators and dollars for a peak rate.

The unit searched is one replica: a colocated scenario is searched with
`cluster.replicas=1`; a PD scenario with one prefill:decode group as configured (or as
each `--pd-ratios` entry). Replicas for a peak = ceil(peak / max rate per replica), which
assumes the router spreads load evenly over replicas.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.plan.capacity import Probe, confidence, replay_variants, search, trace_rate
from simulator.plan.keys import BaseScenario
from simulator.plan.pricing import check_cost_table_names, cluster_cost
from simulator.plan.slo import SLOSet
from simulator.preflight import preflight_as
from simulator.scenario import Scenario, apply_overrides, read_scenario_yaml, scenario_from_dict
from simulator.yaml_file import read_yaml_mapping

RESULT_FILE = "capacity.json"


@dataclass(frozen=True)
class CapacityTask:
    """One candidate's search (plain data: it runs in a worker process)."""

    name: str
    base: BaseScenario
    overrides: dict[str, Any]
    slos: SLOSet
    repeats: int = 3
    rel_tol: float = 0.02
    verify_step: float = 0.1
    max_simulations: int = 60
    sim_timeout_s: float | None = None
    progress: bool = False  # one stderr line per simulation (from whichever process runs it)


def parse_pd_ratios(text: str) -> list[tuple[int, int]]:
    """`1:1,1:3` -> [(1, 1), (1, 3)]: prefill and decode replicas per group."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        p, sep, d = part.partition(":")
        if not sep or not p.isdigit() or not d.isdigit() or int(p) < 1 or int(d) < 1:
            raise ValueError(f"--pd-ratios: expected P:D pairs of integers >= 1 like 1:3, got {part!r}")
        out.append((int(p), int(d)))
    if not out:
        raise ValueError("--pd-ratios: give at least one P:D pair, e.g. 1:1,1:3")
    return out


def load_cost_table(path: str | None) -> dict[str, float]:
    """A YAML / JSON mapping of accelerator name -> USD per accelerator-hour."""
    if not path:
        return {}
    p = Path(path)
    data = read_yaml_mapping(p, "cost table (a mapping of accelerator name to USD per hour)")
    for k, v in data.items():
        if not (_finite(v) and v >= 0):
            raise ValueError(f"{p}: {k}: expected a price >= 0 in USD per hour, got {v!r}")
    return {str(k): float(v) for k, v in data.items()}


def candidates(sc: Scenario, hardware: list[str] | None,
               pd_ratios: list[tuple[int, int]] | None) -> list[tuple[str, dict[str, Any]]]:
    """(name, overrides) per candidate: hardware x P:D ratio, on one replica."""
    pd = sc.cluster.pd is not None
    if pd_ratios and not pd:
        raise ValueError("--pd-ratios needs a PD scenario (a cluster.pd block)")
    unit: dict[str, Any] = {} if pd else {"cluster.replicas": 1}
    out = []
    for hw in hardware or [None]:
        hw_over = dict(unit)
        if hw is not None:
            hw_over["hardware"] = hw
            if pd:
                hw_over["cluster.pd.prefill.hardware"] = hw
                hw_over["cluster.pd.decode.hardware"] = hw
        for ratio in pd_ratios or [None]:
            over = dict(hw_over)
            label = hw if hw is not None else _hw_label(sc)
            if ratio is not None:
                over["cluster.pd.prefill.replicas"], over["cluster.pd.decode.replicas"] = ratio
                label += f" {ratio[0]}P:{ratio[1]}D"
            elif pd:
                label += f" {sc.cluster.pd.prefill.replicas}P:{sc.cluster.pd.decode.replicas}D"
            out.append((label, over))
    return out


def _hw_label(sc: Scenario) -> str:
    return sc.hardware if isinstance(sc.hardware, str) else str(sc.hardware.get("name", "custom"))


def search_candidate(task: CapacityTask) -> dict[str, Any]:
    """The search for one candidate, as a JSON-able dict (errors recorded, not raised)."""
    t0 = time.perf_counter()
    row: dict[str, Any] = {"name": task.name, "overrides": task.overrides}
    probe = Probe(task.base, task.overrides, task.slos, timeout_s=task.sim_timeout_s,
                  progress_name=task.name if task.progress else None)
    try:
        sc = task.base.build(task.overrides)
        variants, what = replay_variants(task.base, task.overrides, task.repeats)
        probe.variants = [{}, *variants]
        start, _ = trace_rate(task.base, task.overrides)
        res = search(probe, start, rel_tol=task.rel_tol, verify_step=task.verify_step,
                     max_simulations=task.max_simulations)
        res.confidence = confidence(probe, res, what)
        cost = cluster_cost(sc, task.base.cost_table)
        row.update(status="ok" if res.max_rate is not None else "unattainable", error="",
                   max_rate_rps=res.max_rate, fail_rate_rps=res.fail_rate,
                   start_rate_rps=res.start_rate, note=res.note, confidence=res.confidence,
                   gpus_per_replica=cost.gpus, usd_per_hour_per_replica=cost.usd_per_hour,
                   cost_note=cost.note(), price_assumption=cost.price_text())
        if res.max_rate is not None:
            at_max = probe.metrics(res.max_rate)
            row["metrics_at_max"] = {k: at_max.get(k) for k in probe.evaluations[0]["metrics"]}
            row["usd_per_m_output_tokens"] = at_max.get("cost.usd_per_m_output_tokens")
            row["max_rate_per_gpu"] = res.max_rate / cost.gpus if cost.gpus else None
    except Exception as exc:  # one candidate failing must not stop the others
        row.update(status="failed", error=f"{type(exc).__name__}: {exc}")
    row["evaluations"] = probe.evaluations
    row["num_simulations"] = probe.num_simulations
    row["wall_s"] = time.perf_counter() - t0
    return row


def add_peak(row: dict[str, Any], peak_rps: float | None) -> None:
    """Replicas, accelerators and USD/hour needed for `peak_rps` (requests/s)."""
    rate = row.get("max_rate_rps")
    if not peak_rps or not rate:
        return
    n = math.ceil(peak_rps / rate - 1e-9)
    row["replicas_for_peak"] = n
    row["gpus_for_peak"] = n * row["gpus_per_replica"]
    usd = row.get("usd_per_hour_per_replica")
    row["usd_per_hour_for_peak"] = None if usd is None else n * usd


def best_candidate(rows: list[dict[str, Any]]) -> str | None:
    """Lowest USD per million output tokens; without prices, the highest rate per GPU."""
    ok = [r for r in rows if r.get("max_rate_rps")]
    priced = [r for r in ok if r.get("usd_per_m_output_tokens") is not None]
    if priced:
        return min(priced, key=lambda r: r["usd_per_m_output_tokens"])["name"]
    return max(ok, key=lambda r: r.get("max_rate_per_gpu") or 0.0)["name"] if ok else None


def _unit_note(sc: Scenario, peak_rps: float | None) -> str | None:
    """What the search did with a colocated scenario's own `cluster.replicas` (it searches one)."""
    n = sc.cluster.replicas
    if sc.cluster.pd is not None or n == 1:
        return None
    return (f"the scenario's cluster.replicas = {n} is searched as one replica: the rates are "
            "per replica" + ("" if peak_rps else "; --peak-rate RPS gives the replicas a peak needs"))


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _finite_positive(v: Any) -> bool:
    return _finite(v) and v > 0


def check_search_options(peak_rps: float | None, repeats: int, rel_tol: float,
                         verify_step: float, max_simulations: int, sim_timeout_s: float | None,
                         workers: int | None) -> None:
    """ValueError naming each bad option by its `kvpd capacity` flag, before any simulation
    (a bad bracket width used to fail every candidate after the set-up, with exit code 1)."""
    if peak_rps is not None and not _finite_positive(peak_rps):
        raise ValueError(f"--peak-rate must be a finite number > 0 requests/s, got {peak_rps}")
    if repeats < 0:
        raise ValueError(f"--repeats must be >= 0, got {repeats}")
    if max_simulations < 4:
        raise ValueError(f"--max-sims must be >= 4 (a bracket and its check), got {max_simulations}")
    if not _finite_positive(rel_tol):
        raise ValueError(f"--tol must be a finite number > 0 (the bracket's relative width), "
                         f"got {rel_tol}")
    if not (_finite_positive(verify_step) and verify_step > rel_tol):
        raise ValueError(f"--verify-step must be a finite number above --tol ({rel_tol:g}), "
                         f"got {verify_step}")
    if sim_timeout_s is not None and not _finite_positive(sim_timeout_s):
        raise ValueError(f"--sim-timeout must be a finite number > 0 s, got {sim_timeout_s}")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")


def plan_capacity(scenario_path: str | Path, slos: SLOSet, *, overrides: list[str] | None = None,
                  hardware: list[str] | None = None, pd_ratios: list[tuple[int, int]] | None = None,
                  peak_rps: float | None = None, cost_table: dict[str, float] | None = None,
                  repeats: int = 3, rel_tol: float = 0.02, verify_step: float = 0.1,
                  max_simulations: int = 60, backend: Any = "process",
                  workers: int | None = None, sim_timeout_s: float | None = None,
                  progress: bool = False) -> dict[str, Any]:
    """Search every candidate and return the capacity result (see `RESULT_FILE`); `progress`:
    a line on stderr per simulation and per finished candidate."""
    from simulator.plan.backends import SerialBackend, make_backend

    t0 = time.perf_counter()
    path = Path(scenario_path)
    data = read_scenario_yaml(path)
    data.setdefault("name", path.stem)  # as load_scenario names an unnamed scenario
    apply_overrides(data, list(overrides or []))
    base_dir = str(path.resolve().parent)
    sc = scenario_from_dict(copy.deepcopy(data), str(path), base_dir)
    check_search_options(peak_rps, repeats, rel_tol, verify_step, max_simulations,
                         sim_timeout_s, workers)
    tasks = []
    base = BaseScenario(data, str(path), base_dir, cost_table or {})
    used: list[str] = []
    for name, over in candidates(sc, hardware, pd_ratios):
        cand = base.build({**over, **slos.per_request()})
        preflight_as(cand, f"{path}: candidate {name}")
        cost = cluster_cost(cand, cost_table)
        used += [p[0] for p in cost.prices] + list(cost.unpriced)
        tasks.append(CapacityTask(name, base, over, slos, repeats, rel_tol, verify_step,
                                  max_simulations, sim_timeout_s, progress))
    check_cost_table_names(cost_table or {}, list(dict.fromkeys(used)), "--cost-table")
    engine = SerialBackend() if len(tasks) == 1 and isinstance(backend, str) else (
        make_backend(backend, workers=workers) if isinstance(backend, str) else backend)
    rows: list[dict[str, Any] | None] = [None] * len(tasks)
    try:
        for i, ok, value in engine.map_unordered(search_candidate, tasks):
            rows[i] = value if ok else {"name": tasks[i].name, "status": "failed",
                                        "error": f"worker failed: {value}", "evaluations": [],
                                        "num_simulations": 0}
            if progress:
                done_n = sum(r is not None for r in rows)
                rate = rows[i].get("max_rate_rps")
                what = f"max {rate:.4g} req/s" if rate else rows[i].get("status")
                print(f"[{done_n}/{len(tasks)} candidates] {tasks[i].name}: {what}",
                      file=sys.stderr, flush=True)
    finally:
        if isinstance(backend, str):
            engine.close()
    done = [r for r in rows if r is not None]
    for r in done:
        add_peak(r, peak_rps)
    return {
        "kind": "capacity", "scenario": str(path), "name": sc.name, "overrides": overrides or [],
        "slo": slos.to_dict(), "slo_text": slos.describe(), "peak_rps": peak_rps,
        "cost_table": cost_table or {}, "unit": "one PD group" if sc.cluster.pd else "one replica",
        "unit_note": _unit_note(sc, peak_rps),
        "candidates": done, "best": best_candidate(done),
        "num_simulations": sum(r.get("num_simulations", 0) for r in done),
        "wall_s": time.perf_counter() - t0,
    }


def write_result(result: dict[str, Any], out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULT_FILE
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path
