"""The engine step both backends run: `schedule(now) -> SchedulerOutput`,
`executor.execute(output) -> StepResult`, `update(output, result, now)`.

The simulator's executor asks a cost model for the step's duration; the real one
runs the model and measures it. `IdealExecutor` (fixed seconds per step plus
seconds per token) drives the core in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from simulator.core.request import Request
from simulator.core.scheduler import Scheduler
from simulator.core.scheduler_output import SchedulerOutput, StepResult


class Executor(Protocol):
    def execute(self, output: SchedulerOutput) -> StepResult: ...


@dataclass
class IdealExecutor:
    """Step time = `step_s` + `token_s` x scheduled tokens (s). Produces no token ids
    unless `token_id` is set (then every sampled token is that id)."""

    step_s: float = 0.01
    token_s: float = 0.0
    token_id: int | None = None

    def execute(self, output: SchedulerOutput) -> StepResult:
        duration = self.step_s + self.token_s * output.shape.num_tokens
        sampled = None if self.token_id is None else [self.token_id] * len(output.reqs)
        return StepResult(duration_s=duration, sampled_token_ids=sampled)


@dataclass
class EngineStepOutput:
    """What one `EngineCore.step` did. `kv_ready`: prefill-role requests whose KV may
    now be sent to a decode worker."""

    scheduler_output: SchedulerOutput
    finished: list[Request]
    end_time: float  # s
    kv_ready: list[Request] = field(default_factory=list)

    @property
    def scheduled(self) -> list[Request]:
        return self.scheduler_output.reqs


class EngineCore:
    """One replica's engine: a scheduler (with its KV manager) and an executor."""

    def __init__(self, scheduler: Scheduler, executor: Executor) -> None:
        self.scheduler = scheduler
        self.executor = executor

    def add_request(self, req: Request, now: float | None = None) -> None:
        self.scheduler.add_request(req, now)

    def abort_request(self, request_id: str, now: float, reason: str = "aborted",
                      report: bool = True) -> bool:
        return self.scheduler.abort_request(request_id, now, reason, report)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self, now: float) -> EngineStepOutput:
        """Run one step that starts at `now` (s); token times are `now + duration_s`."""
        output = self.scheduler.schedule(now)
        if output.is_empty and not output.blocks_to_copy:
            result = StepResult(duration_s=0.0)
            # nothing ran: the executor has not seen these yet, hand them to the next step
            self.scheduler.finished_req_ids[:0] = output.finished_req_ids
        else:
            result = self.executor.execute(output)
        end = now + result.duration_s
        finished = self.scheduler.update(output, result, end)
        return EngineStepOutput(output, finished, end, self.scheduler.pop_kv_ready())

    def run_until_idle(self, now: float = 0.0, max_steps: int = 10_000_000) -> float:
        """Step with virtual time until every request has finished; returns the end time."""
        for _ in range(max_steps):
            if not self.has_unfinished_requests():
                return now
            step = self.step(now)
            out = step.scheduler_output
            if out.is_empty and not step.finished and not out.kv_to_receive:
                raise RuntimeError(
                    "no progress: nothing can be scheduled "
                    f"({len(self.scheduler.waiting_for_kv)} requests wait for remote KV)"
                )
            now = step.end_time
        raise RuntimeError(f"requests still unfinished after {max_steps} steps")
