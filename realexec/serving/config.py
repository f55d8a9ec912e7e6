"""`ServeConfig`: what `kvpd serve` / `EngineClient` deploy (one colocated engine, or P prefill
and D decode workers), and the worker processes built from it (`spawn` start method)."""

from __future__ import annotations

import multiprocessing as mp
import os
from dataclasses import dataclass, field
from typing import Any

from realexec.serving.engine_proc import worker_main
from realexec.serving.worker_spec import WorkerSpec


def parse_pd(text: str) -> tuple[int, int]:
    """"P:D" -> (P, D), both integers >= 1; ValueError naming the expected form."""
    parts = str(text).split(":")
    try:
        p, d = (int(x) for x in parts)
    except ValueError:
        raise ValueError(f"--pd must look like P:D with integers, e.g. 1:1 or 2:1; got {text!r}") from None
    if p < 1 or d < 1:
        raise ValueError(f"--pd needs at least one prefill and one decode worker, got {text!r}")
    return p, d


@dataclass
class ServeConfig:
    """A deployment. `model` and `llm_kwargs` go to `realexec.LLM` in every worker.

    pd: None for one colocated engine, or (num_prefill, num_decode) workers.
    kv_mode: "full" or "layerwise" (see `realexec.serving.pd.prefill`). transport: "ipc" or "tcp".
    kv_timeout_s: the decode side recomputes a prompt whose KV is this late (s).
    heartbeat_s: idle heartbeat period of workers (s); a worker silent for
    `heartbeat_timeout_s` is stalled (unhealthy, given no new requests, taken back if it
    speaks again); one silent for `worker_kill_timeout_s`, or whose process exits, is down
    and its requests fail. restart_workers: start a down worker again (else the front end's
    `on_worker_down` is told).
    role_llm_kwargs: per-role overrides of `llm_kwargs` ({"decode": {"num_gpu_blocks": 64}}).
    num_threads: torch threads per worker (default: the CPUs split evenly among workers).
    fault_drop_kv: prefill workers drop every KV transfer (tests/benchmarks of the fallback).
    step_log_dir: a folder where each worker appends its steps to `<worker>.steps.jsonl`
    (`realexec.serving.step_log`); None for no logs.
    """

    model: Any = "llama-50m"
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    role_llm_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pd: tuple[int, int] | None = None
    kv_mode: str = "full"
    transport: str = "ipc"
    kv_timeout_s: float = 5.0
    kv_hold_timeout_s: float = 60.0
    heartbeat_s: float = 0.25
    heartbeat_timeout_s: float = 30.0
    # vLLM's VLLM_ENGINE_ITERATION_TIMEOUT_S (60 s): how long an engine step may take before
    # the engine is declared dead
    worker_kill_timeout_s: float = 60.0
    restart_workers: bool = False
    startup_timeout_s: float = 180.0
    num_threads: int | None = None
    max_staging_bytes: int = 1 << 30
    fault_drop_kv: bool = False
    step_log_dir: str | None = None
    log_level: str = "WARNING"

    def __post_init__(self) -> None:
        if self.pd is not None:
            if isinstance(self.pd, str):
                self.pd = parse_pd(self.pd)
            p, d = self.pd
            if p < 1 or d < 1:
                raise ValueError(f"pd needs at least one prefill and one decode worker, got {self.pd}")
        unknown = set(self.role_llm_kwargs) - {"colocated", "prefill", "decode"}
        if unknown:
            raise ValueError(f"role_llm_kwargs: unknown role(s) {sorted(unknown)}")
        if self.kv_mode not in ("full", "layerwise"):
            raise ValueError(f"kv_mode must be 'full' or 'layerwise', got {self.kv_mode!r}")
        if self.transport not in ("ipc", "tcp"):
            raise ValueError(f"transport must be 'ipc' or 'tcp', got {self.transport!r}")
        for name in ("kv_timeout_s", "heartbeat_s", "heartbeat_timeout_s", "startup_timeout_s",
                     "worker_kill_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 s, got {getattr(self, name)!r}")
        if self.num_threads is not None and (
                isinstance(self.num_threads, bool) or not isinstance(self.num_threads, int)
                or self.num_threads < 1):
            raise ValueError(f"num_threads must be an integer >= 1 (None: the CPUs split among "
                             f"the workers), got {self.num_threads!r}")
        if self.worker_kill_timeout_s < self.heartbeat_timeout_s:
            raise ValueError(f"worker_kill_timeout_s ({self.worker_kill_timeout_s} s) must be >= "
                             f"heartbeat_timeout_s ({self.heartbeat_timeout_s} s)")

    @property
    def worker_roles(self) -> list[tuple[str, str]]:
        """(name, role) of every worker: decode workers first, so their KV sockets exist
        before prefill workers are told about them."""
        if self.pd is None:
            return [("engine-0", "colocated")]
        p, d = self.pd
        return [(f"decode-{i}", "decode") for i in range(d)] + [
            (f"prefill-{i}", "prefill") for i in range(p)
        ]

    def worker_specs(self, output_addr: str, ipc_dir: str) -> list[WorkerSpec]:
        roles = self.worker_roles
        threads = self.num_threads or max(1, (os.cpu_count() or 1) // len(roles))
        return [
            WorkerSpec(
                name=name, output_addr=output_addr, role=role,
                llm_kwargs={"model": self.model, **self.llm_kwargs,
                            **self.role_llm_kwargs.get(role, {})},
                transport=self.transport, ipc_dir=ipc_dir, kv_mode=self.kv_mode,
                kv_timeout_s=self.kv_timeout_s, kv_hold_timeout_s=self.kv_hold_timeout_s,
                heartbeat_s=self.heartbeat_s, num_threads=threads,
                max_staging_bytes=self.max_staging_bytes,
                fault_drop_kv=self.fault_drop_kv and role == "prefill",
                step_log=os.path.join(self.step_log_dir, f"{name}.steps.jsonl")
                if self.step_log_dir else "",
                parent_pid=os.getpid(), log_level=self.log_level,
            )
            for name, role in roles
        ]


def spawn_worker(spec: WorkerSpec) -> mp.process.BaseProcess:
    """Start a worker process (spawn: torch is not fork-safe)."""
    proc = mp.get_context("spawn").Process(
        target=worker_main, args=(spec,), name=f"kvpd-{spec.name}", daemon=True
    )
    proc.start()
    return proc
