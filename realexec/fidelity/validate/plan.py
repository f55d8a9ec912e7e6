"""What `kvpd validate` runs: the traces (Azure conversation slice, bursty Gamma), the rates
(fractions of the capacity the calibrated simulator predicts), and the simulator scenario that
mirrors a real run (same model, knobs, KV blocks, trace; the calibrated device and links).
Imports no torch: everything here is the simulator's side."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import workloads
from simulator.calibrate.step_speeds import Speed, compute_memory
from simulator.cost.params import CostParams
from workloads.shared_traces import TRACES_DIR_ENV, azure_conv_path

TRACE_KINDS = ("azure", "gamma")
MODES = ("colocated", "pd")
# When a PD run's first token counts (simulator `cluster.pd.first_token`): at the prefill
# hand-off, as the real front end streams it (realexec/serving/client.py).
PD_FIRST_TOKEN = "prefill"
# A bursty synthetic trace of a very different shape: Gamma arrivals with CV 4 (the issue's
# spec), short prompts (median 24 tokens) and medium outputs; lognormal lengths.
GAMMA_SPEC: dict[str, Any] = {
    "name": "gamma-cv4-short",
    "arrival": {"process": "gamma", "rate": 1.0, "cv": 4.0},
    "prompt_len": {"dist": "lognormal", "median": 24, "sigma": 0.8, "min": 4, "max": 192},
    "output_len": {"dist": "lognormal", "median": 48, "sigma": 0.6, "min": 4, "max": 256},
}


@dataclass(frozen=True)
class RunKnobs:
    """Scheduler and KV-cache knobs both backends run with (vLLM names; `to_dict()` is
    `LLM` keyword arguments)."""

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    num_gpu_blocks: int = 512  # the same KV pool (blocks) in the real engine and the simulator
    num_cpu_blocks: int = 0  # host pool for swap preemption (both backends)
    block_size: int = 16
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False  # prompts are random: no prefix reuse either way
    preemption_mode: str = "recompute"
    policy: str = "fcfs"
    max_model_len: int | None = None  # default: the model's context

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _swap_gb(model_config: dict[str, Any], dtype: str, knobs: RunKnobs) -> float:
    """The scenario's host pool (GB) holding exactly `knobs.num_cpu_blocks` blocks (the
    simulator derives blocks = floor(GB x 1e9 / block bytes); half a block of slack)."""
    if not knobs.num_cpu_blocks:
        return 0.0
    from simulator.cost.models import ModelSpec

    spec = ModelSpec.from_hf_config(model_config)
    block_bytes = spec.kv_bytes_per_token(dtype) * knobs.block_size
    return (knobs.num_cpu_blocks + 0.5) * block_bytes / 1e9


def base_trace(kind: str, context: int, *, path: Path | None = None,
               window_s: tuple[float, float] = (0.0, 180.0), num_requests: int = 2000,
               seed: int = 0) -> tuple[workloads.Trace, dict[str, Any]]:
    """The trace a validation draws its runs from, and how it was made.

    azure: the `window_s` slice of the Azure LLM inference trace 2023, conversation (smooth,
    near-Poisson; `path`, default `azure_conv_path()` at call time), prompt and output
    lengths scaled by one factor so that the longest request fits `context` tokens.
    gamma: `num_requests` of `GAMMA_SPEC` (seeded). Runs take the first requests of it at a
    rescaled rate (`run_trace`)."""
    if kind == "azure":
        path = azure_conv_path() if path is None else path
        if not Path(path).is_file():
            raise FileNotFoundError(f"azure trace not found: {path} (pass its path, e.g. "
                                    f"`--trace-path`, or set {TRACES_DIR_ENV} to its folder)")
        t = workloads.time_window(workloads.load_trace(path), *window_s)
        if len(t) == 0:
            raise ValueError(f"{path}: no requests in the window {list(window_s)} s")
        longest = int((t.prompt_len + t.output_len).max())
        f = min(1.0, context / longest)
        t = workloads.scale_lengths(t, prompt=f, output=f)
        prompt = np.clip(t.prompt_len, 1, context - 1)
        t = t.replace(prompt_len=prompt, output_len=np.clip(t.output_len, 1, context - prompt))
        info = {"kind": kind, "path": str(path), "window_s": list(window_s), "length_scale": f,
                "context": context, "num_requests": len(t)}
    elif kind == "gamma":
        spec = {**GAMMA_SPEC, "num_requests": num_requests}
        t = workloads.synthesize(spec, seed)
        info = {"kind": kind, "spec": spec, "seed": seed, "context": context,
                "num_requests": len(t)}
    else:
        raise ValueError(f"trace kind {kind!r}: expected one of {list(TRACE_KINDS)}")
    info["mean_prompt_tokens"] = float(t.prompt_len.mean())
    info["mean_output_tokens"] = float(t.output_len.mean())
    return t, info


def run_trace(base: workloads.Trace, rate: float, num_requests: int) -> workloads.Trace:
    """The first `num_requests` of `base` at mean `rate` requests/s, from t = 0."""
    t = workloads.first_n(base, min(num_requests, len(base)))
    if len(t) > 1:
        t = workloads.rescale_rate(t, rate)
    return t.replace(arrival_s=t.arrival_s - t.arrival_s[0])


# A speed read from a few requests depends on which they were: in run 7 of the CPU
# validation the 13 requests 20 s of azure held at 0.26 req/s read the engine 5-10% faster
# than the run's 47 ran. The floor is the serving probe's size (not measured to be enough).
TRACE_PROBE_MIN_REQUESTS = 16


def trace_probe(base: workloads.Trace, rate: float, skip: int,
                duration_s: float) -> tuple[workloads.Trace, dict[str, Any]]:
    """A rate's trace probe: the requests of `base`, its time scaled to mean `rate`
    requests/s, that arrive within `duration_s` of request `skip` (at least
    `TRACE_PROBE_MIN_REQUESTS`, or all of `base` if it is shorter), from t = 0. With `skip`
    past every request a run of this trace replays, the probe has the runs' length mix, load
    and burstiness but none of their requests. When `base` has too few requests from `skip`
    on, its last ones are taken (their lengths then repeat validated requests':
    `overlaps_runs`)."""
    if not duration_s > 0:
        raise ValueError(f"trace probe: duration_s must be > 0, got {duration_s!r}")
    if len(base) < 2:
        raise ValueError(f"trace probe: the trace has {len(base)} request(s), needs >= 2")
    least = min(TRACE_PROBE_MIN_REQUESTS, len(base))
    scaled = workloads.rescale_rate(base, rate)
    start = min(skip, len(base) - least)
    t0 = scaled.arrival_s[start]
    end = max(int(np.searchsorted(scaled.arrival_s, t0 + duration_s, side="left")), start + least)
    t = scaled.take(np.arange(start, end))
    t = t.replace(arrival_s=t.arrival_s - t0, name=f"{base.name}-probe")
    return t, {"first_request": int(start), "num_requests": len(t), "duration_s": duration_s,
               "overlaps_runs": start < skip}


def scenario_dict(model_config: dict[str, Any], dtype: str, calibration: Path,
                  params: CostParams, knobs: RunKnobs, mode: str, trace_file: Path,
                  seed: int = 0, serving_loop: bool = True) -> dict[str, Any]:
    """The simulator scenario mirroring a real run (paths absolute). With the calibration's
    serving speed for the mode's engines, each engine's device runs at it
    (`hardware.serving_speed`, simulator/calibrate/calibrated.py); `serving_loop=False` (an engine
    driven in-process) leaves out the calibration's serving-loop terms."""
    hw = dict(params.extra.get("hardware") or {})
    hw["calibration"] = str(Path(calibration).resolve())
    if not serving_loop:
        hw["serving_loop"] = False
    sched = {k: getattr(knobs, k) for k in ("max_num_seqs", "max_num_batched_tokens",
                                            "enable_chunked_prefill", "preemption_mode", "policy")}
    if knobs.max_model_len:
        sched["max_model_len"] = knobs.max_model_len
    sc: dict[str, Any] = {
        "name": f"validate-{mode}", "seed": seed, "model": model_config, "dtype": dtype,
        "hardware": hw, "scheduler": sched,
        "cache": {"block_size": knobs.block_size, "num_gpu_blocks": knobs.num_gpu_blocks,
                  "enable_prefix_caching": knobs.enable_prefix_caching,
                  "swap_space_gb": _swap_gb(model_config, dtype, knobs)},
        "workload": {"trace": str(Path(trace_file).resolve()), "format": "generic_csv"},
        "output": {"plots": False, "timeseries": False},
    }
    if mode == "pd":
        link = (params.extra.get("links") or {}).get("kv_transfer")
        if not link:
            raise ValueError(f"{calibration}: no kv_transfer link fitted; profile with transfers "
                             "to validate PD")
        # the real PD front end streams the first token when the prefill worker hands the
        # request off (realexec/serving/client.py), so the simulator counts it there too
        sc["cluster"] = {"pd": {"link": {k: link[k] for k in ("name", "bandwidth_gb_s", "latency_us")},
                                "transfer": "whole", "first_token": PD_FIRST_TOKEN}}
        # the real prefill and decode workers are two processes on this one host: while
        # the other worker is in a step, a step streams memory and computes at the
        # shares fitted from the profile's contended steps (else the measured bandwidth
        # share of two streams)
        from simulator.calibrate.host_share import host_shares

        memory, compute = host_shares(params.extra)
        if memory:
            sc["cluster"]["host_memory_share"] = memory
        if compute:
            sc["cluster"]["host_compute_share"] = compute
    elif mode != "colocated":
        raise ValueError(f"mode {mode!r}: expected one of {list(MODES)}")
    if serving_factors(params, mode):  # each engine at the speed it served at
        hw["serving_speed"] = True
    return sc


def serving_factors(params: CostParams, mode: str) -> dict[str, float] | None:
    """The calibration's `serving_speed` (simulator/calibrate/serving_speed.py) for the engines of
    `mode`, keyed as `rescaled_scenario` takes them ({"engine": f} colocated, {"prefill": f,
    "decode": f} PD); None when it measured none for them."""
    from simulator.calibrate.calibrated import serving_speed

    roles = {"engine": "colocated"} if mode == "colocated" else {"prefill": "prefill",
                                                                 "decode": "decode"}
    try:  # the same reading `hardware.serving_speed` applies
        return {key: serving_speed(params, role) for key, role in roles.items()}
    except ValueError:
        return None


def engine_factors(params: CostParams, sc: dict[str, Any], factor: float = 1.0) -> dict[str, float]:
    """Each engine of scenario `sc` at `factor` x its serving speed (1 where the calibration
    has none), for `rescaled_scenario`."""
    mode = "pd" if (sc.get("cluster") or {}).get("pd") else "colocated"
    base = serving_factors(params, mode) or (
        {"engine": 1.0} if mode == "colocated" else {"prefill": 1.0, "decode": 1.0})
    return {role: factor * f for role, f in base.items()}


def scaled_hardware(params: CostParams, factor: Speed, path: Path) -> dict[str, Any]:
    """A hardware spec: the calibrated device of `params` running `factor` x as fast (every
    step time / factor; links unchanged), or with compute (peaks and fixed overheads) and
    memory bandwidth at their own factors ({"compute": c, "memory": m}: `step_speeds`); its
    calibration written to `path`."""
    from simulator.calibrate.calibrated import overheads_at_speed

    c, m = compute_memory(factor)
    hw = dict(params.extra.get("hardware") or {})
    hw.update(base=params.device, name=params.device, fp32_tflops_scale=c,
              bf16_tflops_scale=c, mem_bw_tbps_scale=m)
    scaled = dataclasses.replace(overheads_at_speed(params, c),
                                 extra={**params.extra, "hardware": hw})
    scaled.save(str(path))
    return {**hw, "calibration": str(path.resolve())}


def rescaled_scenario(params: CostParams, sc: dict[str, Any], factors: dict[str, Speed],
                      stem: Path, tag: str) -> dict[str, Any]:
    """`sc` with each engine's device `factors` x as fast ({"engine": f} colocated,
    {"prefill": f, "decode": f} PD; f a `Speed`); scaled calibrations are written beside
    `stem`."""
    if "engine" in factors:
        path = stem.with_name(f"{stem.name}-{tag}.yaml")
        hw = scaled_hardware(params, factors["engine"], path)
        if "serving_loop" in sc["hardware"]:  # an in-process engine stays without its loop
            hw["serving_loop"] = sc["hardware"]["serving_loop"]
        return dict(sc, hardware=hw)
    pd = dict(sc["cluster"]["pd"])
    for role, f in factors.items():
        path = stem.with_name(f"{stem.name}-{role}-{tag}.yaml")
        pd[role] = {**(pd.get(role) or {}), "hardware": scaled_hardware(params, f, path)}
    return {**sc, "cluster": {**sc["cluster"], "pd": pd}}


def simulate(scenario: dict[str, Any]):
    """Run the scenario; returns the simulator's `SimResult`."""
    from simulator.run import run_scenario
    from simulator.scenario import scenario_from_dict

    return run_scenario(scenario_from_dict(scenario, "validate scenario"))


def _simulate_trace(scenario: dict[str, Any], trace: workloads.Trace, trace_file: Path):
    from workloads import write_trace

    write_trace(trace, trace_file)
    return simulate(dict(scenario, workload={"trace": str(Path(trace_file).resolve()),
                                             "format": "generic_csv"}))


def capacity(scenario: dict[str, Any], base: workloads.Trace, num_requests: int,
             trace_file: Path) -> float:
    """Requests/s the calibrated simulator serves when `num_requests` of `base` arrive at
    once (the saturated service rate for this trace's length mix, batches as full as the
    scheduler allows: an upper bound on the rate it keeps up with as requests arrive)."""
    s = _simulate_trace(scenario, run_trace(base, 1e4, num_requests), trace_file).summary
    return float(s["throughput"]["requests_per_s"])


def queue_growing(records: dict[str, np.ndarray]) -> bool:
    """A run's queue kept growing: the last third of arrivals waited (median) more than
    twice as long as the first third, and over half a second."""
    q = np.asarray(records["queueing_s"], dtype=float)[np.argsort(records["arrival_s"])]
    q = q[~np.isnan(q)]
    if q.size < 6:
        return False
    k = q.size // 3
    first, last = float(np.median(q[:k])), float(np.median(q[-k:]))
    return last > 2 * first + 0.5


SUSTAINED_STEPS = 6  # bisection steps: the rate to 1/64 of the burst capacity


def sustained_capacity(scenario: dict[str, Any], base: workloads.Trace, burst: float,
                       num_requests: Callable[[float], int], trace_file: Path,
                       steps: int = SUSTAINED_STEPS) -> tuple[float, list[list[Any]]]:
    """The highest rate (requests/s, within `burst` / 2**steps) at which the calibrated
    simulator keeps up with `base` as the validation replays it: its run of
    `run_trace(base, rate, num_requests(rate))` has no growing queue (`queue_growing`). Found
    by bisection below the burst capacity `burst`; with it, the search's [rate, growing]
    points. Arrivals spread in time batch less than a burst, and a trace's later requests
    may be longer, so it can be well below `burst` (run 16: the Azure 1P1D queue grew, real
    and simulated, at 0.6 and 0.9 of the burst capacity)."""
    points: list[list[Any]] = []

    def grows(rate: float) -> bool:
        trace = run_trace(base, rate, num_requests(rate))
        out = queue_growing(_simulate_trace(scenario, trace, trace_file).records)
        points.append([rate, out])
        return out

    if not burst > 0 or not grows(burst):
        return burst, points
    lo, hi = 0.0, burst
    for _ in range(steps):
        mid = (lo + hi) / 2
        if grows(mid):
            hi = mid
        else:
            lo = mid
    return (lo if lo > 0 else hi), points  # hi: even the lowest rate tried grew
