"""`WorkerSpec`: what one engine worker process is told at start (picklable for `spawn`), and
`bind`, how a worker binds its sockets."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import zmq

from simulator.core.config import ROLES


@dataclass
class WorkerSpec:
    """Everything a worker process needs (picklable for the `spawn` start method).

    transport: "ipc" (sockets under `ipc_dir`) or "tcp" (127.0.0.1, ephemeral ports).
    kv_mode: "full" (one message per request after its prompt) or "layerwise" (one message per
    layer, sent as each layer's KV is written during the step that completes the prompt).
    kv_timeout_s: decode side: how long after allocating blocks it waits for the KV before
    recomputing the prompt itself. kv_hold_timeout_s: prefill side: how long it holds a
    handed-off request's blocks without an acknowledgement. heartbeat_s: idle heartbeat period.
    fault_drop_kv: drop every outgoing KV transfer (tests and benchmarks of the fallback).
    step_log: a file to append one JSON line per step to (`realexec.serving.step_log`); "" for none.
    """

    name: str
    output_addr: str
    role: str = "colocated"
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    transport: str = "ipc"
    ipc_dir: str = ""
    kv_mode: str = "full"
    kv_timeout_s: float = 5.0
    kv_hold_timeout_s: float = 60.0
    heartbeat_s: float = 0.25
    num_threads: int | None = None
    max_staging_bytes: int = 1 << 30
    fault_drop_kv: bool = False
    step_log: str = ""
    parent_pid: int = 0
    log_level: str = "WARNING"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"worker {self.name}: role must be one of {ROLES}, got {self.role!r}")
        if self.transport not in ("ipc", "tcp"):
            raise ValueError(f"worker {self.name}: transport must be 'ipc' or 'tcp'")
        if self.kv_mode not in ("full", "layerwise"):
            raise ValueError(f"worker {self.name}: kv_mode must be 'full' or 'layerwise'")
        if not self.kv_timeout_s > 0 or not self.heartbeat_s > 0:
            raise ValueError(f"worker {self.name}: kv_timeout_s and heartbeat_s must be > 0 s")


def bind(sock: zmq.Socket, spec: WorkerSpec, what: str) -> str:
    """Bind `sock` on a fresh endpoint; returns the endpoint peers connect to."""
    if spec.transport == "tcp":
        sock.bind("tcp://127.0.0.1:*")
    else:
        sock.bind(f"ipc://{os.path.join(spec.ipc_dir, f'{spec.name}-{what}')}")
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()
