"""Per-step logs of serving workers: one JSON line per engine step that ran requests.

A worker started with `WorkerSpec.step_log` appends `{"t": wall start (s, epoch), "s":
duration (s, schedule + execute + update), "shape": BatchShape fields, "l": host seconds
of serving-loop work this step waited on (`engine_proc.LoopClock`: after the previous step
until the loop first waited for input, plus from its last wake-up to this step; absent on a
worker's first step), "lc": the CPU seconds the worker's engine thread used in that time
(so "l" - "lc" is time it waited for a core or a lock), "h": requests whose KV this step
handed to the transport and "ht": their prompt tokens (PD prefill worker), "k": requests whose
received KV the loop wrote into the pool before this step and "kt": the tokens written (PD
decode worker)}` per step. Lines are buffered and written when the worker goes idle, every
`FLUSH_EVERY` steps and at exit, so a reader sees a run's steps a heartbeat after its last
request finished. `kvpd validate` reads them to check the calibrated cost model on the PD
workers' own steps and to see when the two workers' steps overlapped.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from simulator.calibrate.step_pricing import TimedStep
from simulator.core.batch_shape import BatchShape

FLUSH_EVERY = 256  # steps


LoggedStep = TimedStep  # one step read back from a log


class StepLogWriter:
    """Buffered JSON-lines writer (the worker side)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.buffer: list[str] = []

    def add(self, t_start: float, duration_s: float, shape: BatchShape,
            loop_s: float | None = None, handoffs: int = 0, handoff_tokens: int = 0,
            loop_cpu_s: float | None = None, landings: int = 0, landing_tokens: int = 0) -> None:
        line: dict[str, Any] = {"t": t_start, "s": duration_s, "shape": dataclasses.asdict(shape)}
        if loop_s is not None:
            line["l"] = loop_s
        if loop_cpu_s is not None:
            line["lc"] = loop_cpu_s
        if handoffs:
            line["h"] = handoffs
            line["ht"] = handoff_tokens
        if landings:
            line["k"] = landings
            line["kt"] = landing_tokens
        self.buffer.append(json.dumps(line))
        if len(self.buffer) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        with self.path.open("a") as f:
            f.write("\n".join(self.buffer) + "\n")
        self.buffer.clear()


def read_step_log(path: str | Path, offset: int = 0) -> tuple[list[LoggedStep], int]:
    """The complete lines of `path` from byte `offset` on, and the offset after them (a
    partly written last line is left for the next read). A missing file reads as empty; a
    malformed line raises ValueError naming the file and line."""
    p = Path(path)
    if not p.exists():
        return [], offset
    with p.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    steps = []
    for i, line in enumerate(data[:end].splitlines()):
        if not line.strip():
            continue
        try:
            d: dict[str, Any] = json.loads(line)
            loop_s = d.get("l")
            steps.append(LoggedStep(float(d["t"]), float(d["s"]), BatchShape(**d["shape"]),
                                    None if loop_s is None else float(loop_s), int(d.get("h", 0)),
                                    int(d.get("ht", 0)), int(d.get("k", 0)), int(d.get("kt", 0))))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{p}: step log line {i + 1} after byte {offset} is malformed: "
                             f"{exc}") from None
    return steps, offset + end
