"""`kvpd profile`'s whole run on the local device: the step grid (`Profiler`), the fresh-shape
check, host facts and contention, and the serving probe, written as one profile."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from realexec.fidelity.profile.contention import host_contention
from realexec.fidelity.profile.facts import (
    catalog_device,
    device_facts,
    memory_bandwidth_share,
)
from realexec.fidelity.profile.fresh_shapes import fresh_shape_check
from realexec.fidelity.profile.idle_wake import idle_wake
from realexec.fidelity.profile.profiler import PROFILE_KINDS, ProfileGrid, Profiler, Progress
from realexec.fidelity.profile.serving_probe import serving_probe
from simulator.calibrate.fresh_shapes import describe_fresh_shapes
from simulator.calibrate.profile_io import write_profile


def profile_device(out: str | Path, model: str | dict[str, Any] = "llama-50m",
                   dtype: str = "fp32", device: str | None = None, threads: int | None = None,
                   grid: ProfileGrid | None = None, seed: int = 0, hardware: str | None = None,
                   kinds: tuple[str, ...] = PROFILE_KINDS, serving_requests: int = 0,
                   progress: Progress = None) -> Path:
    """Profile `model` on the local device and write `out` (CSV + JSON); returns the CSV path.

    `threads`: torch intra-op threads (default: torch's); `hardware`: the catalog entry to
    calibrate (default: guessed from the device); `serving_requests`: requests of the
    serving probe (`realexec.fidelity.profile.serving_probe`; 0: none) replayed through a real colocated
    engine and, when transfers are profiled, a real 1P1D pair, after the grid."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    prof = Profiler(model, dtype, device, grid, seed, progress)
    dev = prof.llm.device
    facts_before = device_facts(dev)
    rows = prof.run(kinds)
    fresh = None
    if "steps" in kinds:  # would served steps (new shapes) cost what these repeated ones did?
        fresh = fresh_shape_check(prof)
        prof.progress(describe_fresh_shapes(fresh))
    facts = device_facts(dev)
    facts["loadavg_1m_start"] = facts_before["loadavg_1m"]
    facts["cpu_available"] = prof.cpu_available
    if dev.type == "cpu":  # what co-located PD workers share (cluster.host_memory_share)
        prof.progress("host memory bandwidth: alone and 2 processes at once")
        facts.update(memory_bandwidth_share())
        if "steps" in kinds:  # steps beside a busy neighbour (cluster.host_*_share)
            facts["host_contention"] = host_contention(prof)
    if "steps" in kinds:  # the first step after an idle spell (CostParams.idle_wake_s)
        facts["idle_wake"] = idle_wake(prof)
    probe = None
    block_size = prof.llm.kv_cache.block_size
    if serving_requests > 0:
        prof.llm = None  # the probe's engines need the device memory
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        pd = "transfer" in kinds and not prof.recurrent
        if "transfer" in kinds and prof.recurrent:
            prof.progress("serving probe (pd): skipped (PD hand-off sends KV blocks, not a "
                          "request's linear-attention state; such a model runs colocated)")
        probe = serving_probe(prof.config, dtype, device, threads, serving_requests, seed,
                              ("colocated", "pd") if pd else ("colocated",), prof.progress)
    meta = {
        "device": hardware or catalog_device(dev),
        "model": prof.name,
        "model_config": prof.config,
        "dtype": dtype,
        "block_size": block_size,
        "device_facts": facts,
        "grid": prof.grid.to_dict(),
        "seed": seed,
        "timing": "wall time of LLM.step() (schedule + copies + forward + sampling + update)",
        "kv_block_order": "scattered (seeded shuffle)" if prof.grid.scatter_blocks else "id order",
        "elapsed_s": time.perf_counter() - t0,
    }
    if fresh is not None:
        meta["fresh_shapes"] = fresh
    if probe is not None:
        meta["serving_probe"] = probe
    return write_profile(rows, meta, out)
