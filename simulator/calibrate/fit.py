"""`kvpd calibrate PROFILE`: fit the cost model's free parameters to a real step-time profile.

The fit (`scipy.optimize.least_squares`, soft-L1 loss on relative errors, a few seeded
starts) adjusts the `CostParams` efficiencies (bounded to (0, 1]) and overheads (seconds,
>= 0) so that `CostModel.step_time` matches the measured medians of the step kinds
(`prefill`, `chunk`, `decode`, `mixed`). The fit includes the executor-behaviour terms
`decode_padding` and `overlap` (fractions in [0, 1]), `gemv_memory_efficiency` (one-row
GEMMs), `decode_attn_overhead_s` (decode attention's set-up per layer) and
`request_overhead_s` (host work per scheduled request), and chooses
`gemm_row_passes_below` from `ROW_PASS_CHOICES` by fit cost; the same fit with those terms
at their roofline defaults is reported beside it (`extra.fit.roofline_only`). A profile with fewer than
`POINTS_PER_PARAM` x `len(FREE_FIELDS)` fitting points keeps those terms at their defaults
and fits the roofline parameters only. Three parameters are held, because one
single-device profile of one model cannot tell them apart from others:

- `comm_efficiency`: there is no tensor-parallel traffic on one device;
- `layer_overhead_s`: with one model depth it adds the same seconds to every step as
  `step_overhead_s` (perfectly collinear); it keeps its default and `step_overhead_s`
  absorbs the rest;
- `token_overhead_s`: host work per token (a few list appends) is far below a step's
  noise, and a free per-token term trades against GEMM compute (in the CPU profiles of
  runs 10 and 11 it took 0.33 ms per token while the GEMM compute efficiency went to its
  bound of 1); the per-request term (`request_overhead_s`) keeps the host work that
  matters.

A seeded, per-kind share of the points (`held_out`) is held back and only used to report
the error (MAPE, median absolute error). Swap copies and PD KV transfers are fitted as
links (latency + bytes / bandwidth, non-negative least squares) for the scenario's
`hardware.pcie` and `cluster.pd.link`. The linears timed alone at every small size give
the GEMM size factors between the step sizes (simulator/calibrate/linears.py). A CPU
profile's steps timed beside a busy neighbour process give the host-sharing shares (`extra.host_sharing`, `simulator.calibrate.host_share`) that
`kvpd validate` simulates its 1P1D runs with.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares, nnls

from simulator.calibrate.calibration import Calibration, hardware_spec, kind_stats
from simulator.calibrate.host_share import fit_host_sharing, host_shares
from simulator.calibrate.idle_wake import fit_idle_wake
from simulator.calibrate.linears import fit_size_factors
from simulator.calibrate.loop import fit_loop, loop_params
from simulator.calibrate.profile_io import STEP_KINDS, Profile, read_profile
from simulator.calibrate.serving_speed import fit_serving_speed
from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import Accelerator, get_accelerator
from simulator.cost.models import ModelSpec
from simulator.cost.params import BEHAVIOUR_FIELDS, EFFICIENCY_FIELDS, OVERHEAD_FIELDS, CostParams

HELD_FIELDS = ("comm_efficiency", "layer_overhead_s", "token_overhead_s")
STATISTICS = ("median", "mean", "cpu")
FREE_FIELDS = tuple(f for f in CostParams.FIT_FIELDS if f not in HELD_FIELDS)
# executor terms: fitted with enough points, else (and in the "roofline only" comparison)
# at their roofline values (GEMV streams as GEMM)
EXECUTOR_FIELDS = (*BEHAVIOUR_FIELDS, "gemv_memory_efficiency", "decode_attn_overhead_s",
                   "request_overhead_s")
ROOFLINE_FIELDS = tuple(f for f in FREE_FIELDS if f not in EXECUTOR_FIELDS)
# `gemm_row_passes_below` candidates: off, or MKL's small-M behaviour (measured on the CPU
# executor: linears of 2 or 3 rows cost 1.8x / 2.7x one row, 4+ rows run as one GEMM).
ROW_PASS_CHOICES = (0, 4)
POINTS_PER_PARAM = 2  # fitting points needed per free parameter (an over-determined fit)
# Typical magnitudes (efficiency: a fraction; overheads: s) so that the solver's steps
# are comparable across parameters.
_X_SCALE = {"step_overhead_s": 1e-3, "token_overhead_s": 1e-5, "request_overhead_s": 1e-5,
            "decode_attn_overhead_s": 1e-4}
_NUM_STARTS = 4  # defaults + 3 seeded random starts (the roofline max() is not convex)


def model_of(profile: Profile) -> ModelSpec:
    """The simulator's ModelSpec of the profiled model (named as the profile names it)."""
    cfg = profile.meta["model_config"]
    if not isinstance(cfg, dict):
        raise ValueError(f"{profile.path}: model_config must be an HF config mapping")
    return ModelSpec.from_hf_config(cfg, name=profile.model)


def held_back(kinds: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """A seeded per-kind choice of round(fraction x n) points to hold back (none of a kind
    with fewer than 3 points, so each kind keeps points in the fit)."""
    if not 0 <= fraction < 1:
        raise ValueError(f"held_out must be a fraction in [0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    held = np.zeros(len(kinds), dtype=bool)
    for k in STEP_KINDS:
        idx = np.flatnonzero(kinds == k)
        n = int(round(fraction * idx.size)) if idx.size >= 3 else 0
        if n:
            held[rng.choice(idx, size=n, replace=False)] = True
    return held


def _check_enough(n_steps: int, n_train: int, n_free: int, fraction: float) -> None:
    need = POINTS_PER_PARAM * n_free
    if n_train >= need:
        return
    total_needed = math.ceil(need / (1 - fraction)) if fraction < 1 else need
    raise ValueError(
        f"too few profile points: {n_steps} step points ({n_train} left for fitting after "
        f"holding back {n_steps - n_train}), but fitting {n_free} parameters needs at least "
        f"{need} fitting points ({POINTS_PER_PARAM} per parameter): profile at least "
        f"{max(total_needed - n_steps, 1)} more step points (a larger --grid) or hold back less")


def _predict(model: ModelSpec, acc: Accelerator, dtype: str, params: CostParams,
             shapes: list) -> np.ndarray:
    cm = CostModel(model, acc, dtype, params=params)
    return np.array([cm.step_time(s) for s in shapes])


def fit_params(model: ModelSpec, acc: Accelerator, dtype: str, shapes: list,
               measured: np.ndarray, base: CostParams, seed: int = 0,
               free: tuple[str, ...] = FREE_FIELDS) -> tuple[CostParams, float]:
    """Least-squares fit of `free` (relative errors, soft-L1 loss), best of `_NUM_STARTS`
    starts; the other fields keep `base`'s values. Returns (params, final cost)."""
    lo_all, hi_all = CostParams.fit_bounds()
    bounds_of = dict(zip(CostParams.FIT_FIELDS, zip(lo_all, hi_all)))
    lo = np.array([bounds_of[f][0] for f in free])
    hi = np.array([bounds_of[f][1] for f in free])
    scale = np.array([_X_SCALE.get(f, 0.1) for f in free])

    def make(x: np.ndarray) -> CostParams:
        values = dict(zip(free, map(float, x)))
        if "gemv_memory_efficiency" not in free:  # not fitted: GEMV streams as GEMM
            values["gemv_memory_efficiency"] = values.get("gemm_memory_efficiency",
                                                          base.gemm_memory_efficiency)
        return dataclasses.replace(base, **values)

    def residuals(x: np.ndarray) -> np.ndarray:
        return _predict(model, acc, dtype, make(x), shapes) / measured - 1.0

    rng = np.random.default_rng(seed)
    x0 = np.clip(np.array([getattr(base, f) for f in free]), lo, hi)
    starts = [x0]
    is_frac = np.array([f not in OVERHEAD_FIELDS for f in free])
    for _ in range(_NUM_STARTS - 1):
        frac = rng.uniform(0.05, 1.0, size=lo.size)
        ovh = scale * rng.uniform(0.0, 20.0, size=lo.size)
        starts.append(np.clip(np.where(is_frac, frac, ovh), lo, hi))
    best = None
    for x in starts:
        res = least_squares(residuals, x, bounds=(lo, hi), x_scale=scale, loss="soft_l1",
                            f_scale=0.05, max_nfev=400)
        if best is None or res.cost < best.cost:
            best = res
    return make(best.x), float(best.cost)


def fit_with_row_passes(model: ModelSpec, acc: Accelerator, dtype: str, shapes: list,
                        measured: np.ndarray, base: CostParams, seed: int = 0
                        ) -> tuple[CostParams, float]:
    """`fit_params` of `FREE_FIELDS` for each `ROW_PASS_CHOICES` value of
    `gemm_row_passes_below`; the fit with the lower cost."""
    fits = [fit_params(model, acc, dtype, shapes, measured,
                       dataclasses.replace(base, gemm_row_passes_below=k), seed)
            for k in ROW_PASS_CHOICES]
    return min(fits, key=lambda f: f[1])


def step_shape(prof: Profile, i: int) -> BatchShape:
    """The `BatchShape` of profile row `i`. Profiles do not record `max_decode_context`: a
    `decode` step's longest context is `max_context`; a `mixed` step's decodes share one
    context in the profiler's grid (realexec/fidelity/profile/profiler.py), so it is their mean (rounded up)."""
    shape = prof.shape(i)
    if shape.num_decode_reqs and not shape.max_decode_context:
        if shape.num_prefill_reqs == 0:
            shape.max_decode_context = shape.max_context
        else:
            shape.max_decode_context = -(-shape.decode_context_tokens // shape.num_decode_reqs)
    return shape


def speed_scaled(params: CostParams, factor: float) -> CostParams:
    """`params` with every step time divided by `factor` (efficiencies x factor, overheads /
    factor; 0 < factor <= 1 keeps efficiencies in (0, 1]): a device `factor` as fast."""
    if not 0 < factor <= 1:
        raise ValueError(f"speed factor must be in (0, 1], got {factor}")
    ch = {f: getattr(params, f) * factor for f in EFFICIENCY_FIELDS if f != "comm_efficiency"}
    ch.update({f: getattr(params, f) / factor for f in OVERHEAD_FIELDS})
    return dataclasses.replace(params, **ch)


def fit_link(nbytes: np.ndarray, seconds: np.ndarray, name: str) -> dict[str, Any]:
    """latency + bytes / bandwidth by non-negative least squares on relative errors."""
    a = np.column_stack([1.0 / seconds, nbytes / seconds])
    (lat, inv_bw), _ = nnls(a, np.ones_like(seconds))
    pred = lat + nbytes * inv_bw
    bw = 1.0 / inv_bw if inv_bw > 0 else float(nbytes.max() / seconds.min())
    return {"name": name, "bandwidth_gb_s": float(bw / 1e9), "latency_us": float(lat * 1e6),
            "mape": float(np.mean(np.abs(pred / seconds - 1))), "num_points": int(seconds.size)}


def calibrate(profile: Profile | str | Path, *, hardware: str | None = None,
              held_out: float = 0.25, seed: int = 0, model: str | None = None,
              device: str | None = None, statistic: str = "median") -> Calibration:
    """Fit `CostParams` for the profile's device and model.

    `model` / `device`: what the caller expects; a profile of another is refused, naming both.
    `hardware`: the catalog accelerator whose peaks the efficiencies refer to (default: the
    profile's device). `statistic`: fit the points' `median` (robust) or `mean` (what a long
    run averages, contention phases included) wall time, or `cpu`: their median on-CPU time
    (one-thread CPU profiles; free of other processes' noise), then slow every term by the
    profile's CPU share (`device_facts.cpu_available`) so the saved parameters predict wall
    time at the contention the profile saw. Errors are reported on the fitted statistic."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {list(STATISTICS)}, got {statistic!r}")
    prof = profile if isinstance(profile, Profile) else read_profile(profile)
    where = str(prof.path)
    if model is not None and model != prof.model:
        raise ValueError(f"{where}: profile is for model {prof.model!r}, not {model!r}")
    if device is not None and device != prof.device:
        raise ValueError(f"{where}: profile is for device {prof.device!r}, not {device!r}")
    spec = model_of(prof)
    acc = get_accelerator(hardware or prof.device)
    dtype = str(prof.meta["dtype"])
    step = np.flatnonzero(prof.mask(*STEP_KINDS))
    kinds = prof.columns["kind"][step]
    measured = prof.columns[f"{statistic}_median_s" if statistic == "cpu" else f"{statistic}_s"][
        step].astype(float)
    share = prof.meta["device_facts"].get("cpu_available")
    if statistic == "cpu" and (not share or not (measured > 0).all()):
        raise ValueError(f"{where}: statistic 'cpu' needs a one-thread CPU profile with on-CPU "
                         "times (cpu_median_s) and device_facts.cpu_available; use median or mean")
    shapes = [step_shape(prof, i) for i in step]
    held = held_back(kinds, held_out, seed)
    n_train = int((~held).sum())
    _check_enough(len(step), n_train, len(ROOFLINE_FIELDS), held_out)
    # the executor terms need their own points; a small profile keeps them at the roofline
    free = FREE_FIELDS if n_train >= POINTS_PER_PARAM * len(FREE_FIELDS) else ROOFLINE_FIELDS
    base = CostParams.default_for(acc)
    train = ~held
    train_shapes = [s for s, t in zip(shapes, train) if t]
    roofline_only: dict[str, Any] = {}
    size_report: dict[str, Any] = {}
    if free == ROOFLINE_FIELDS:
        fitted, _ = fit_params(spec, acc, dtype, train_shapes, measured[train], base, seed, free)
    else:
        fitted, _ = fit_with_row_passes(spec, acc, dtype, train_shapes, measured[train], base, seed)
        # GEMM size effects from the linears timed alone, then the fit again with them in
        # place, so step points at a slow or fast BLAS size do not bend the fitted terms
        tables, size_report = fit_size_factors(prof, CostModel(spec, acc, dtype, params=fitted))
        if tables:
            fitted, _ = fit_params(spec, acc, dtype, train_shapes, measured[train],
                                   dataclasses.replace(fitted, **tables), seed)
        # the same fit without the executor terms (plain roofline), for the report only
        roof, _ = fit_params(spec, acc, dtype, train_shapes, measured[train], base, seed,
                             free=ROOFLINE_FIELDS)
        roof_err = np.abs(_predict(spec, acc, dtype, roof, shapes) / measured - 1)
        roofline_only = {**kind_stats(roof_err, held),
                         "per_kind": {k: kind_stats(roof_err[kinds == k], held[kinds == k])
                                      for k in STEP_KINDS if (kinds == k).any()}}
    predicted = _predict(spec, acc, dtype, fitted, shapes)
    err = np.abs(predicted / measured - 1)
    per_kind = {k: kind_stats(err[kinds == k], held[kinds == k])
                for k in STEP_KINDS if (kinds == k).any()}
    links = {}
    for name, kinds_ in (("swap", ("swap_out", "swap_in")), ("kv_transfer", ("kv_transfer",))):
        m = prof.mask(*kinds_)
        if m.sum() >= 2:
            links[name] = fit_link(prof.columns["num_bytes"][m].astype(float),
                                   prof.columns["median_s"][m].astype(float),
                                   f"{acc.name}-{name.replace('_', '-')}")
    cal = Calibration(fitted, prof, kinds, measured, predicted, held, per_kind, links,
                      roofline_only=roofline_only)
    fit_info: dict[str, Any] = {"statistic": statistic}
    if statistic == "cpu":  # the saved parameters predict wall time at the profile's CPU share
        fit_info.update(cpu_available=float(share),
                        cpu_params={f: getattr(fitted, f) for f in free})
        fitted = speed_scaled(fitted, float(share))
        wall = prof.columns["mean_s"][step].astype(float)
        fit_info["wall_check"] = kind_stats(np.abs(predicted / share / wall - 1), held)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cal.params = dataclasses.replace(
        fitted, device=prof.device if hardware is None else acc.name, model=prof.model,
        source=f"kvpd calibrate {where} ({stamp})",
        # (the profiled model's HF config: `kvpd validate` builds the real engine from it when
        # a scenario leaves the model out, wherever the model's files were)
        extra={"profile": where, "dtype": dtype, "model_config": prof.meta["model_config"],
               "device_facts": prof.meta["device_facts"],
               "fit": {"free": list(free) + (["gemm_row_passes_below"] if free == FREE_FIELDS else []), "held": {f: getattr(fitted, f) for f in HELD_FIELDS},
                       "held_out_fraction": held_out, "seed": seed, **fit_info,
                       **cal.summary(),
                       "per_kind": per_kind, "roofline_only": roofline_only},
               "links": links})
    if not size_report:  # the roofline-only fit of a small profile: measured, not refitted
        tables, size_report = fit_size_factors(prof, CostModel(spec, acc, dtype, params=cal.params))
        cal.params = dataclasses.replace(cal.params, **tables)
    cal.params.extra["fit"]["size_factors"] = size_report
    contention = prof.meta["device_facts"].get("host_contention")
    if contention:  # CPU profiles: steps timed beside a busy neighbour process
        try:
            cal.params.extra["host_sharing"] = fit_host_sharing(
                contention, CostModel(spec, acc, dtype, params=cal.params))
        except ValueError as exc:
            cal.params.extra["host_sharing"] = {"error": str(exc)}
    wake = prof.meta["device_facts"].get("idle_wake")
    if wake:  # the first step after an idle spell vs the same step back to back
        try:
            fit = fit_idle_wake(wake)
        except ValueError as exc:
            fit = {"error": str(exc)}
        cal.params = dataclasses.replace(cal.params, **{
            k: fit[k] for k in ("idle_wake_s", "idle_wake_tau_s") if k in fit})
        cal.params.extra["idle_wake"] = fit
    if prof.meta.get("fresh_shapes"):  # steps of never-run shapes vs repeated ones
        cal.params.extra["fresh_shapes"] = prof.meta["fresh_shapes"]
    probe = prof.meta.get("serving_probe")
    if probe:  # steps a real colocated engine and 1P1D pair ran while serving
        try:
            cal.params.extra["serving_speed"] = fit_serving_speed(
                probe, CostModel(spec, acc, dtype, params=cal.params),
                *host_shares(cal.params.extra))
        except ValueError as exc:
            cal.params.extra["serving_speed"] = {"error": str(exc)}
        try:  # the serving loop's host time between steps, which no grid step contains
            loop = fit_loop(probe)
        except ValueError as exc:
            loop = {"error": str(exc)}
        cal.params = dataclasses.replace(cal.params, **loop_params(loop))
        cal.params.extra["serving_loop"] = loop
    cal.hardware = hardware_spec(cal.params, links)
    cal.params.extra["hardware"] = cal.hardware
    return cal
