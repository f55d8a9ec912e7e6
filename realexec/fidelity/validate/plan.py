"""What `kvpd validate` runs on the simulator's side: the scenario that mirrors a real run
(same model, knobs, KV blocks and requests; the calibrated device and links), the rates
(fractions of the capacity the calibrated simulator predicts), and the device re-scaled to a
measured speed. Imports no torch."""

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

MODES = ("colocated", "pd")
# When a PD run's first token counts (simulator `cluster.pd.first_token`): at the prefill
# hand-off, as the real front end streams it (realexec/serving/client.py).
PD_FIRST_TOKEN = "prefill"


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
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = False
    preemption_mode: str = "recompute"
    policy: str = "fcfs"
    batching: str = "continuous"
    capacity_policy: str = "max_utilization"
    mixed_batches: bool = True
    first_token_from_decode: bool = False
    prompt_allocation: str = "per_chunk"
    admission_watermark: float = 0.0
    append_needs_free_block: bool = False
    recv_interval: int = 1
    batch_wait_timeout_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0.0
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


def run_trace(base: workloads.Trace, rate: float, num_requests: int) -> workloads.Trace:
    """The first `num_requests` of `base` at mean `rate` requests/s, from t = 0."""
    t = workloads.first_n(base, min(num_requests, len(base)))
    if len(t) > 1:
        t = workloads.rescale_rate(t, rate)
    return t.replace(arrival_s=t.arrival_s - t.arrival_s[0])


def scenario_dict(model_config: dict[str, Any], dtype: str, calibration: Path,
                  params: CostParams, knobs: RunKnobs, mode: str, trace_file: Path,
                  seed: int = 0, serving_loop: bool = True) -> dict[str, Any]:
    """The simulator scenario mirroring a real run (paths absolute): the calibrated device at
    its profiled speed (`rescaled_scenario` moves it to a measured one); `serving_loop=False`
    (an engine driven in-process) leaves out the calibration's serving-loop terms."""
    hw = dict(params.extra.get("hardware") or {})
    hw["calibration"] = str(Path(calibration).resolve())
    if not serving_loop:
        hw["serving_loop"] = False
    sched = {k: getattr(knobs, k) for k in ("max_num_seqs", "max_num_batched_tokens",
                                            "enable_chunked_prefill", "long_prefill_token_threshold",
                                            "preemption_mode", "policy", "batching",
                                            "capacity_policy", "mixed_batches",
                                            "first_token_from_decode", "prompt_allocation",
                                            "admission_watermark", "append_needs_free_block",
                                            "recv_interval", "batch_wait_timeout_iters",
                                            "batch_wait_max_tokens_ratio")}
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
    return sc


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
