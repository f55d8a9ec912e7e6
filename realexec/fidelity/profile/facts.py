"""Facts a profile records about where it ran (device, threads, memory, versions, load) and
which model it ran (HF config + name), and the hardware catalog entry of the local device."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from realexec.engine.configs import BUILTIN_CONFIGS, builtin_config


def catalog_device(device: torch.device) -> str:
    """The hardware catalog entry of `device`: `cpu`, or the GPU whose catalog name or alias
    appears in the device name (pairs of words first: "H100 PCIe" -> h100-pcie)."""
    from simulator.cost.catalog_match import normalize_name
    from simulator.cost.hardware import get_accelerator

    if device.type == "cpu":
        return "cpu"
    raw = torch.cuda.get_device_name(device) if device.type == "cuda" else "mps"
    words = normalize_name(raw).replace("-", " ").split()
    for cand in ["-".join(p) for p in zip(words, words[1:])] + words:
        try:
            return get_accelerator(cand).name
        except ValueError:
            continue
    raise ValueError(f"device {raw!r} has no hardware catalog entry; pass --hardware NAME")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_facts(device: torch.device) -> dict[str, Any]:
    """What the timings depend on: device name, threads, memory, library versions, load."""
    import numpy
    import scipy

    from realexec.engine.kv_cache import total_memory_bytes

    facts: dict[str, Any] = {
        "type": device.type,
        "name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "torch_threads": torch.get_num_threads(),
        "logical_cpus": os.cpu_count(),
        "memory_bytes": total_memory_bytes(device),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {"torch": torch.__version__, "numpy": numpy.__version__,
                     "scipy": scipy.__version__},
        "loadavg_1m": os.getloadavg()[0],
    }
    try:
        import transformers

        facts["versions"]["transformers"] = transformers.__version__
    except ImportError:
        pass
    return facts


def model_identity(model: str | dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(HF config dict, name) of a built-in name, a config.json path/folder or a config dict;
    the name goes into `_name_or_path` so the simulator's ModelSpec carries it too."""
    if isinstance(model, dict):
        cfg = dict(model)
        name = str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")
    elif model in BUILTIN_CONFIGS:
        cfg, name = builtin_config(model), str(model)
    else:
        p = Path(model)
        path = p / "config.json" if p.is_dir() else p
        if not path.is_file():
            raise ValueError(f"model {model!r}: not a built-in name ({', '.join(BUILTIN_CONFIGS)}) "
                             "nor a config.json / model folder")
        cfg = json.loads(path.read_text())
        name = str(cfg.get("_name_or_path") or path.resolve().parent.name)
    cfg["_name_or_path"] = name
    return cfg, name


def _stream_gb_s(seconds: float, nbytes: int, queue: Any = None, go: Any = None) -> float:
    """GB/s of repeated one-thread reductions over an `nbytes` fp32 tensor (a streaming read,
    as a memory-bound decode step's weight reads) for `seconds`; in a child process, reports
    "ready" on `queue`, waits for `go`, then puts its GB/s on `queue`."""
    import time

    torch.set_num_threads(1)
    a = torch.ones(nbytes // 4)
    a.sum()
    if go is not None:
        queue.put("ready")
        go.wait(120)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a.sum()
        n += 1
    gb_s = n * nbytes / (time.perf_counter() - t0) / 1e9
    if queue is not None:
        queue.put(gb_s)
    return gb_s


def memory_bandwidth_share(processes: int = 2, seconds: float = 2.0,
                           nbytes: int = 256 << 20) -> dict[str, float]:
    """Host memory bandwidth of one thread alone, and the share of it each of `processes`
    concurrent processes gets (what two PD workers on one CPU machine see:
    `cluster.host_memory_share`). Spawns `processes` processes for about `seconds`."""
    import multiprocessing as mp

    threads = torch.get_num_threads()
    try:
        alone = _stream_gb_s(seconds, nbytes)
    finally:
        torch.set_num_threads(threads)
    ctx = mp.get_context("spawn")
    queue, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_stream_gb_s, args=(seconds, nbytes, queue, go), daemon=True)
             for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        for _ in procs:  # every process has imported torch and touched its tensor
            queue.get(timeout=120)
        go.set()
        got = [float(queue.get(timeout=120)) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return {"mem_bw_gb_s": alone, "mem_bw_share": float(sum(got) / len(got) / alone),
            "mem_bw_share_processes": processes}


def sched_times(pid: int | None = None) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for one) of a process's main thread,
    from /proc/PID/schedstat (Linux); None where it is not available."""
    try:
        run_ns, wait_ns = Path(f"/proc/{pid or 'self'}/schedstat").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def cpu_available(before: tuple[float, float] | None, after: tuple[float, float] | None
                  ) -> float | None:
    """Share of its runnable time a thread actually ran between two `sched_times` readings:
    1.0 on an idle machine, 0.5 when it waited as long as it ran (CPU contention)."""
    if before is None or after is None:
        return None
    run, wait = after[0] - before[0], after[1] - before[1]
    return run / (run + wait) if run + wait > 0 else None
