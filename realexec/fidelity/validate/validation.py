"""`kvpd validate`: replay scenarios on the real engine (through the replay client) and in the
calibrated simulator, and judge the simulator's error per metric against the real engine's
own run-to-run spread.

For each case (a scenario in a mode: `source.load_cases`), the calibrated simulator's
capacity for its requests, at the speed the first serving probe measures, sets the rates
(`fractions` of the highest rate its simulated run keeps up with,
`plan.sustained_capacity`), unless `rates` are given. Each rate runs `repeats`
times on the real engine (the repeats go round the rates, so a slow phase of a shared
machine spreads over them) with the same scheduler knobs, KV blocks and requests as the
simulated run.

The one speed refresh: a serving probe (a short fixed load of other requests,
`speed_probe.serving_probe_trace`) replayed through the same real engine before every real
run, and once after the last, measures how fast each engine runs its steps relative to the
calibration. Each real run is simulated once with each engine's device at the mean of the
probes just before and just after it (bracketing: the machine's speed during that run, as
far as measurements around it tell); the rate's simulated value is the mean over those
runs. A rate whose real engine fails is reported; the other rates keep their results.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

import workloads
from realexec.fidelity.validate.backends import ColocatedBackend, ServedBackend, run_failure
from realexec.fidelity.validate.plan import (
    capacity,
    queue_growing,
    rescaled_scenario,
    run_trace,
    simulate,
    sustained_capacity,
)
from realexec.fidelity.validate.source import (
    DEFAULT_NUM_GPU_BLOCKS,
    Case,
    case_scenario,
    load_cases,
)
from realexec.fidelity.validate.verdict import compare
from simulator.calibrate.step_pricing import speed_factors

Progress = Callable[[str], None]
# `kvpd validate` warns when the serving probe before the first run finds an engine more
# than this far from the calibrated speed (issue 31): the machine is not the one profiled.
SPEED_WARN = 0.10


@dataclass
class ValidateConfig:
    calibration: Path
    out: Path
    scenarios: tuple[Path, ...]
    overrides: tuple[str, ...] = ()  # `--set KEY=VALUE`, applied to every scenario
    modes: tuple[str, ...] | None = None  # each scenario in these modes (default: its own)
    fractions: tuple[float, ...] = (0.3, 0.6, 0.9)  # of the simulated capacity
    rates: tuple[float, ...] | None = None  # requests/s; overrides fractions
    duration_s: float = 20.0  # a run has rate x duration_s requests (clamped below)
    min_requests: int = 12
    max_requests: int = 400
    repeats: int = 2
    num_gpu_blocks: int = DEFAULT_NUM_GPU_BLOCKS  # for scenarios without cache.num_gpu_blocks
    device: str | None = None
    threads: int | None = None  # torch threads per engine (default: the calibration's)
    capacity_requests: int = 128
    serving_probe_requests: int = 16  # per serving probe (0: none; the calibrated speed then)
    # the colocated engine: "process" (a worker process behind ZMQ, as `kvpd serve` runs it)
    # or "inproc" (an `LLM` inside the validating process)
    colocated_engine: str = "process"


def replay_seed(seed: int, k: int) -> int:
    """The replay seed (token contents of synthetic prompts) of the k-th replay of one load:
    distinct per k, so no replay hits prefix-cache blocks another left behind."""
    return seed + 1000 * (k + 1)


def bracketed(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, float] | None:
    """Per engine, the mean of the serving probes just before and just after one run; the
    one that succeeded when the other failed; None when neither did."""
    got = [p["factors"] for p in (before, after) if p and p.get("factors")]
    if len(got) == 2 and set(got[0]) != set(got[1]):
        got = got[:1]
    if not got:
        return None
    return {k: float(np.mean([g[k] for g in got])) for k in got[0]}


@dataclass
class _RateRun:
    """One rate of one case: its requests and scenario, and what its real repeats gave."""

    index: int
    rate: float  # requests/s
    trace: workloads.Trace
    scenario: dict[str, Any]
    reals: list[dict[str, Any]] = field(default_factory=list)  # summaries
    recs: list[dict[str, np.ndarray]] = field(default_factory=list)  # per-request records
    probes: list[dict[str, Any]] = field(default_factory=list)  # {"before", "after"} per repeat
    wall_s: float = 0.0
    failed: str | None = None


class ValidationInterrupted(BaseException):
    """Stops a validation from outside (`kvpd validate` raises it on SIGTERM, SIGINT or SIGHUP).

    A `BaseException`, so the per-rate `except Exception` does not take it for a failed engine.
    The rates whose real runs completed are still compared and reported."""


class Validation:
    """Runs a `ValidateConfig`; `results` fills as rates complete. Everything is checked in
    the constructor (calibration, device, scenarios): nothing is measured before `run`."""

    def __init__(self, cfg: ValidateConfig, progress: Progress | None = None) -> None:
        from realexec.engine.device import resolve_device
        from realexec.fidelity.profile.facts import catalog_device
        from simulator.cost.params import CostParams

        if cfg.colocated_engine not in ("process", "inproc"):
            raise ValueError(f"colocated_engine must be 'process' or 'inproc', got "
                             f"{cfg.colocated_engine!r}")
        self.cfg = cfg
        self.say = progress or (lambda _m: None)
        params = CostParams.load(str(cfg.calibration))
        # the one speed refresh is the bracketing probes: the profile's serving speed is not
        # applied (every scenario and re-scaled device reads the speed from these params)
        self.params = replace(params, extra={k: v for k, v in params.extra.items()
                                             if k != "serving_speed"})
        local = catalog_device(resolve_device(cfg.device))
        if local != self.params.device:
            raise ValueError(f"{cfg.calibration}: calibration is for device {self.params.device!r}, "
                             f"but the real runs would be on {local!r}; profile and calibrate "
                             "this device first")
        self.cases, self.model_config, self.model_name, self.dtype = load_cases(
            list(cfg.scenarios), self.params, overrides=list(cfg.overrides), modes=cfg.modes,
            num_gpu_blocks=cfg.num_gpu_blocks)
        facts = self.params.extra.get("device_facts") or {}
        self.threads = cfg.threads or facts.get("torch_threads")
        self.cost_model = self._cost_model()
        self.results: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.warnings: list[str] = []
        self.cases_info: dict[str, dict[str, Any]] = {}
        self.records: dict[tuple, dict[str, Any]] = {}  # (case tag, rate i) -> records
        self.serving_probe_trace = None  # its load, built on first use (`_serving_probe`)
        self.engine = None  # the real engine (a backend) of the case being validated

    def _cost_model(self):
        from simulator.calibrate.calibrated import calibrated_cost_model

        return calibrated_cost_model(self.params, self.model_config, self.model_name, self.dtype)

    def llm_kwargs(self, case: Case) -> dict[str, Any]:
        return {**case.knobs.to_dict(), "dtype": self.dtype, "device": self.cfg.device,
                "seed": case.seed, "model_seed": case.seed}

    def _backend(self, case: Case):
        import torch

        if self.threads:
            torch.set_num_threads(int(self.threads))
        runs = self.cfg.out / "runs"
        if case.mode == "colocated" and self.cfg.colocated_engine == "inproc":
            return ColocatedBackend(self.model_config, self.llm_kwargs(case),
                                    runs / f"{case.tag}-steps" / "engine.steps.jsonl")
        return ServedBackend(self.model_config, self.llm_kwargs(case), self.threads,
                             runs / f"{case.tag}-steps", pd=None if case.mode == "colocated" else (1, 1))

    def _num_requests(self, rate: float) -> int:
        """Requests of a run at `rate` req/s: `duration_s` of arrivals, clamped."""
        cfg = self.cfg
        return int(np.clip(round(rate * cfg.duration_s), cfg.min_requests, cfg.max_requests))

    def _serving_loop(self, case: Case) -> bool:
        """Whether the case's real engines run a worker loop between steps (not an `LLM`
        driven in-process), so the simulator charges its cost."""
        return not (case.mode == "colocated" and self.cfg.colocated_engine == "inproc")

    def _scenario(self, case: Case, trace_file: Path) -> dict[str, Any]:
        return case_scenario(case, self.model_config, self.dtype, self.cfg.calibration,
                             self.params, trace_file, self._serving_loop(case))

    def run(self) -> dict[str, Any]:
        self.cfg.out.mkdir(parents=True, exist_ok=True)
        for case in self.cases:
            try:
                self.say(f"[{case.tag}] starting the real engine")
                self.engine = self._backend(case)
                self._case(case)
            except ValidationInterrupted as exc:  # stopped from outside: no further cases
                self.failures.append({"case": case.tag, "rate": None, "error": f"interrupted ({exc})"})
                self.say(f"[{case.tag}] interrupted ({exc}): reporting the rates that completed")
                break
            except Exception as exc:  # the engine would not start: every rate of this case fails
                self.failures.append({"case": case.tag, "rate": None,
                                      "error": f"{type(exc).__name__}: {exc}"})
                self.say(f"[{case.tag}] real engine failed: {exc}")
            finally:
                if self.engine is not None:
                    self.engine.close()
                    self.engine = None
        return self.summary()

    def _case(self, case: Case) -> None:
        cfg = self.cfg
        folder = cfg.out / "runs" / case.tag
        folder.mkdir(parents=True, exist_ok=True)
        self.engine.replay(run_trace(case.base, 1.0, 4), case.seed + 1)  # first-request costs
        # the capacity (and so the rates) at the speed the engine runs now: on a machine
        # slower than when profiled, rates from the calibrated speed would over-load it
        first = self._serving_probe(case)
        self._check_speed(first)
        sc0 = self._scenario(case, folder / "capacity-trace.csv")
        now = bracketed(first, None)
        if now:
            sc0 = rescaled_scenario(self.params, sc0, now, folder / "capacity", "speed")
        burst = capacity(sc0, case.base, cfg.capacity_requests, folder / "capacity-trace.csv")
        cap, search = sustained_capacity(sc0, case.base, burst, self._num_requests,
                                         folder / "capacity-search-trace.csv")
        self.cases_info[case.tag] = {**case.info, "scenario": case.name, "mode": case.mode,
                                     "knobs": case.knobs.to_dict(), "seed": case.seed,
                                     "capacity": {"sustained": cap, "burst": burst, "search": search,
                                                  "speed": now}}
        rates = list(cfg.rates) if cfg.rates else [f * cap for f in cfg.fractions]
        at = ("the speed probed now (" + " ".join(f"{k} {v:.2f}" for k, v in now.items()) + ")"
              if now else "the calibrated speed")
        self.say(f"[{case.tag}] simulated capacity at {at}: {cap:.3f} req/s kept up with "
                 f"({burst:.3f} served at a burst); rates " + ", ".join(f"{r:.3f}" for r in rates))
        runs = []
        for i, rate in enumerate(rates):
            trace = run_trace(case.base, rate, self._num_requests(rate))
            trace_file = folder / f"rate{i}-trace.csv"
            workloads.write_trace(trace, trace_file)
            runs.append(_RateRun(i, rate, trace, self._scenario(case, trace_file)))
        try:
            self._repeats(case, runs, folder, first)
        except ValidationInterrupted as exc:
            self._finish(case, cap, runs, folder, interrupted=str(exc))
            raise
        self._finish(case, cap, runs, folder)

    def _repeats(self, case: Case, runs: list[_RateRun], folder: Path,
                 first: dict[str, Any] | None) -> None:
        """Every rate's real runs, `repeats` each, round the rates, each bracketed by serving
        probes (the probe after a run is the one before the next; a closing one after the
        last). A failed run's engine is replaced by a fresh one for the other rates."""
        cfg = self.cfg
        last: dict[str, Any] | None = None  # the run before's probes, waiting for its "after"
        pending = first  # the probe that set the rates is the first run's "before"
        for rep in range(cfg.repeats):
            for run in runs:
                if run.failed:
                    continue
                probe = pending if pending is not None else self._serving_probe(case)
                pending = None
                if last is not None:
                    last["after"] = probe
                self.say(f"[{case.tag}] rate {run.rate:.3f}, run {rep + 1}/{cfg.repeats}: "
                         + _probe_text(probe))
                t0, wall0 = time.perf_counter(), time.time()
                try:
                    # a seed of its own per repeat: token contents differ between repeats (the
                    # same lengths and shared-prefix structure), so with prefix caching on no
                    # repeat finds the blocks an earlier one left cached, and every run starts
                    # as cold as the simulated one
                    res, preempt, _ = self.engine.replay(run.trace, replay_seed(case.seed, rep))
                    why = run_failure(res)
                    if why:
                        raise RuntimeError(why)
                except Exception as exc:
                    run.failed = f"{type(exc).__name__}: {exc}"
                    self.failures.append({"case": case.tag, "rate": run.rate, "error": run.failed})
                    self.say(f"[{case.tag}] rate {run.rate:.3f} req/s: real engine failed: {run.failed}")
                    self.engine.close()
                    self.engine = None  # if the restart fails, run() has nothing left to close
                    self.engine = self._backend(case)  # a fresh one for the other rates
                    last = None
                    continue
                finally:
                    run.wall_s += time.perf_counter() - t0
                res.summary["preemptions"] = int(preempt)
                res.write(folder / f"rate{run.index}-real{rep}")
                run.reals.append(res.summary)
                run.recs.append(res.records)
                last = {"before": probe, "window": [wall0, time.time()]}
                run.probes.append(last)
        if last is not None and self.engine is not None:
            last["after"] = self._serving_probe(case)

    def _check_speed(self, probe: dict[str, Any] | None) -> None:
        """Warn once, at the validation's first probe, when an engine runs more than
        `SPEED_WARN` away from the calibrated speed."""
        if getattr(self, "_speed_checked", False) or not (probe or {}).get("factors"):
            return
        self._speed_checked = True
        off = {k: f for k, f in (probe.get("factors") or {}).items() if abs(f - 1) > SPEED_WARN}
        if off:
            text = ", ".join(f"{k} {f:.2f}" for k, f in off.items())
            msg = (f"warning: the speed probe before the first run finds {text} x the calibrated "
                   f"speed (more than {SPEED_WARN:.0%} off): this machine is not running as it "
                   "did when profiled (other load, another device, clocks); the bracketing "
                   "follows it, but re-profile on a quiet machine if it persists")
            self.warnings.append(msg)
            self.say(msg)

    def _finish(self, case: Case, cap: float, runs: list[_RateRun], folder: Path,
                interrupted: str | None = None) -> None:
        """Compare every rate with at least one completed real run; when `interrupted`, a rate
        with none is reported as a failure."""
        for run in runs:
            if run.failed:
                continue
            if not run.reals:
                self.failures.append({"case": case.tag, "rate": run.rate,
                                      "error": f"interrupted ({interrupted}) before a real run "
                                               "of it completed"})
                continue
            self._result(case, cap, run, folder)

    def _result(self, case: Case, cap: float, run: _RateRun, folder: Path) -> None:
        """The rate's simulated runs (one per real run, at its bracketed speed), compared."""
        sims, per_run = [], []
        for j, probes in enumerate(run.probes):
            factors = bracketed(probes.get("before"), probes.get("after"))
            per_run.append(factors)
            sc = run.scenario if factors is None else rescaled_scenario(
                self.params, run.scenario, factors, folder / f"rate{run.index}", f"speed{j}")
            sim = simulate(sc)
            sim.write(folder / f"rate{run.index}-sim{j}")
            sims.append(sim)
            if j == 0:
                self.records[(case.tag, run.index)] = {"real": run.recs[0], "sim": sim.records,
                                                       "rate": run.rate}
        load = run.rate / cap if cap else float("inf")
        growing = queue_growing(run.recs[0])
        metrics = compare(run.reals, [s.summary for s in sims])
        label = "over-loaded" if (load >= 1 or growing) else "under-loaded"
        self.results.append({
            "case": case.tag, "scenario": case.name, "mode": case.mode, "rate": run.rate,
            "capacity": cap, "load": load, "label": label, "queue_growing": growing,
            "num_requests": len(run.trace), "repeats": len(run.reals), "real_wall_s": run.wall_s,
            "speed": {"runs": per_run, "probes": run.probes,
                      "refreshed": all(f is not None for f in per_run)},
            "metrics": metrics})
        e = metrics
        self.say(f"[{case.tag}] rate {run.rate:.3f} ({label}, {len(run.trace)} req): "
                 f"tput {e['throughput_tok_s']['error']:+.1%} ttft50 {e['ttft_p50']['error']:+.1%} "
                 f"tpot50 {e['tpot_p50']['error']:+.1%} e2e50 {e['e2e_p50']['error']:+.1%}")

    def _serving_probe(self, case: Case) -> dict[str, Any] | None:
        """The serving probe replayed through the real engine: {"factors": the speed each
        engine ran its steps at relative to the calibration, "wall_s", "window", "num_steps"},
        {"error": why} when it failed (the run goes on), None when disabled."""
        n = self.cfg.serving_probe_requests
        if n <= 0:
            return None
        if self.serving_probe_trace is None:
            from realexec.fidelity.validate.speed_probe import serving_probe_trace

            self.serving_probe_trace = serving_probe_trace(n, self._context(), case.seed + 7)
        backend = self.engine
        self._probes_taken = getattr(self, "_probes_taken", 0) + 1  # each probe's own contents
        t0, wall0 = time.perf_counter(), time.time()
        try:
            res, _, _ = backend.replay(self.serving_probe_trace,
                                       replay_seed(case.seed + 7, self._probes_taken))
            why = run_failure(res)
            if why:
                raise RuntimeError(why)
            cluster = self._scenario(case, Path("probe.csv")).get("cluster")
            factors = speed_factors(backend.steps, self.cost_model, cluster)
            if not factors:
                raise RuntimeError("no steps to price")
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"factors": factors, "wall_s": time.perf_counter() - t0,
                "window": [wall0, time.time()],
                "num_steps": sum(len(v) for v in backend.steps.values())}

    def _context(self) -> int:
        """The shortest context of the cases (the probe's load fits every engine)."""
        return min(int(c.knobs.max_model_len) for c in self.cases)

    def summary(self) -> dict[str, Any]:
        return {"results": self.results, "failures": self.failures, "warnings": self.warnings,
                "cases": self.cases_info}


def _probe_text(probe: dict[str, Any] | None) -> str:
    if probe is None:
        return "no serving probe (the calibrated speed)"
    if "factors" not in probe:
        return f"serving probe failed ({probe.get('error')})"
    return "serving probe " + " ".join(f"{k} {v:.2f}" for k, v in probe["factors"].items())
