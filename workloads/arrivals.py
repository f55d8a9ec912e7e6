"""Synthetic arrival processes (seconds from 0), all seeded through a numpy Generator.

Schema of an `arrival` mapping:

- `process`: `poisson` | `gamma` | `constant` | `piecewise` | `burst`
- `rate`: mean requests per second, > 0 (poisson, gamma, constant)
- `cv`: coefficient of variation of the inter-arrival gaps, > 0. Required for
  `gamma` (cv > 1 is burstier than Poisson, cv < 1 smoother); optional for
  `piecewise` (default 1.0, i.e. Poisson within each piece).
- `pieces`: (piecewise) list of `{duration_s: > 0, rate: >= 0}`; at least one
  rate must be > 0; the schedule repeats after its last piece (periodic load).
- `burst` takes no other key: every request arrives at t = 0 (the "infinite request rate"
  of `trtllm-bench` and `vllm bench serve --request-rate inf`); it needs a request count,
  not a duration. With a closed loop (a scenario's `workload.max_concurrency`) this is the
  usual fixed-concurrency benchmark.

All processes are renewal processes in "operational time" mapped through the
inverse cumulative rate (time rescaling): unit-mean gaps (exponential for
Poisson, Gamma(shape=1/cv^2, scale=cv^2) for Gamma, all 1 for constant) are
summed from 0, so the first request arrives at t = 0 (at the start of the first
non-zero piece for `piecewise`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workloads.spec import check_keys, check_mapping, choice, number, require

PROCESSES = ("poisson", "gamma", "constant", "piecewise", "burst")
_KEYS = {
    "burst": ("process",),
    "poisson": ("process", "rate"),
    "gamma": ("process", "rate", "cv"),
    "constant": ("process", "rate"),
    "piecewise": ("process", "pieces", "cv"),
}
# Upper bound on generated requests: 1e8 rows are ~2.4 GB of columns, past any sane run.
MAX_REQUESTS = 100_000_000


def validate_arrival(spec: Any, where: str = "arrival") -> dict[str, Any]:
    """Checked, normalised copy of an `arrival` mapping (ValueError names the bad key)."""
    spec = check_mapping(spec, where)
    process = choice(spec, "process", where, PROCESSES)
    check_keys(spec, _KEYS[process], where, f"process {process}")
    out: dict[str, Any] = {"process": process}
    if process == "burst":
        return out
    if process == "piecewise":
        pieces = require(spec, "pieces", where, "a list of {duration_s, rate}")
        if not isinstance(pieces, list) or not pieces:
            raise ValueError(f"{where}.pieces: expected a non-empty list of {{duration_s, rate}}")
        durations, rates = [], []
        for i, piece in enumerate(pieces):
            pw = f"{where}.pieces[{i}]"
            piece = check_mapping(piece, pw)
            check_keys(piece, ("duration_s", "rate"), pw)
            durations.append(number(piece, "duration_s", pw, lo=0, lo_open=True))
            rates.append(number(piece, "rate", pw, lo=0))
        if not any(r > 0 for r in rates):
            raise ValueError(f"{where}.pieces: at least one piece needs rate > 0")
        out["pieces"] = [{"duration_s": d, "rate": r} for d, r in zip(durations, rates)]
        out["cv"] = number(spec, "cv", where, default=1.0, lo=0, lo_open=True)
    else:
        out["rate"] = number(spec, "rate", where, lo=0, lo_open=True)
        if process == "gamma":
            out["cv"] = number(spec, "cv", where, lo=0, lo_open=True)
    return out


def arrival_times(
    spec: dict[str, Any],
    rng: np.random.Generator,
    *,
    num_requests: int | None = None,
    duration_s: float | None = None,
) -> np.ndarray:
    """Sorted arrival times (float64 s): exactly `num_requests` of them, or all before `duration_s`."""
    spec = validate_arrival(spec)
    if (num_requests is None) == (duration_s is None):
        raise ValueError("arrival_times: give exactly one of num_requests and duration_s")
    if spec["process"] == "burst":
        if num_requests is None:
            raise ValueError("arrival process burst (every request at t = 0) needs num_requests, "
                             "not duration_s")
        if not 0 <= num_requests <= MAX_REQUESTS:
            raise ValueError(f"num_requests: expected 0..{MAX_REQUESTS}, got {num_requests}")
        return np.zeros(num_requests)
    schedule = _Schedule(spec)
    if num_requests is not None:
        if not 0 <= num_requests <= MAX_REQUESTS:
            raise ValueError(f"num_requests: expected 0..{MAX_REQUESTS}, got {num_requests}")
        return schedule.inverse(_operational_times(spec, rng, num_requests))
    horizon = schedule.cumulative(float(duration_s))
    if horizon > MAX_REQUESTS:
        raise ValueError(f"duration_s: {horizon:.3g} expected requests exceed {MAX_REQUESTS}")
    chunks, start = [], 0.0
    while True:
        # Draw a bit more than expected (mean + 8 sd + 16) so one chunk nearly always suffices.
        remaining = max(horizon - start, 0.0)
        size = int(remaining + 8 * np.sqrt(remaining) * max(spec.get("cv", 1.0), 1.0) + 16)
        tau = _operational_times(spec, rng, size) + start
        chunks.append(tau)
        if tau[-1] >= horizon:
            break
        start = tau[-1] + _gaps(spec, rng, 1)[0]
    tau = np.concatenate(chunks)
    return schedule.inverse(tau[tau < horizon])


def _gaps(spec: dict[str, Any], rng: np.random.Generator, n: int) -> np.ndarray:
    """Unit-mean inter-arrival gaps in operational time."""
    cv = spec.get("cv", 1.0)
    if spec["process"] == "constant":
        return np.ones(n)
    if spec["process"] == "poisson" or cv == 1.0:
        return rng.exponential(1.0, n)
    return rng.gamma(1.0 / cv**2, cv**2, n)


def _operational_times(spec: dict[str, Any], rng: np.random.Generator, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0)
    tau = np.empty(n)
    tau[0] = 0.0
    np.cumsum(_gaps(spec, rng, n - 1), out=tau[1:])
    return tau


class _Schedule:
    """Cumulative rate Lambda(t) (expected requests by time t) and its inverse."""

    def __init__(self, spec: dict[str, Any]) -> None:
        if spec["process"] == "piecewise":
            durations = np.array([p["duration_s"] for p in spec["pieces"]])
            rates = np.array([p["rate"] for p in spec["pieces"]])
        else:
            durations, rates = np.array([1.0]), np.array([spec["rate"]])
        self.t_start = np.concatenate([[0.0], np.cumsum(durations)[:-1]])
        self.c_start = np.concatenate([[0.0], np.cumsum(durations * rates)[:-1]])
        self.rates = rates
        self.period = float(durations.sum())
        self.per_period = float((durations * rates).sum())
        pos = rates > 0
        self._t_pos, self._c_pos, self._r_pos = self.t_start[pos], self.c_start[pos], rates[pos]

    def cumulative(self, t: float) -> float:
        k, rem = divmod(t, self.period)
        j = int(np.searchsorted(self.t_start, rem, side="right")) - 1
        return k * self.per_period + self.c_start[j] + (rem - self.t_start[j]) * self.rates[j]

    def inverse(self, tau: np.ndarray) -> np.ndarray:
        if len(self.rates) == 1:
            return tau / self.rates[0]
        k = np.floor(tau / self.per_period)
        rem = tau - k * self.per_period
        j = np.searchsorted(self._c_pos, rem, side="right") - 1
        t = k * self.period + self._t_pos[j] + (rem - self._c_pos[j]) / self._r_pos[j]
        return np.maximum.accumulate(t) if len(t) else t
