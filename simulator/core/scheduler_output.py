"""What one engine step runs (`SchedulerOutput`) and what it produced (`StepResult`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from simulator.core.batch_shape import BatchShape
from simulator.core.request import Request


@dataclass(slots=True)
class SchedulerOutput:
    """One step's batch, as parallel lists over the scheduled requests.

    Request i computes tokens [num_computed_before[i], num_computed_before[i] +
    num_new_tokens[i]) using device blocks `block_ids[i]` (its whole block table, a
    live reference); it samples a token iff that range ends at `reqs[i].num_tokens`.
    A backend first makes `blocks_to_copy` (device->device, copy-on-write after a
    fork), then `blocks_to_swap_out` (device->host), then `blocks_to_swap_in`
    (host->device), then runs the forward pass.
    """

    step_id: int = 0
    reqs: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_computed_before: list[int] = field(default_factory=list)
    block_ids: list[list[int]] = field(default_factory=list)
    shape: BatchShape = field(default_factory=BatchShape)
    new_req_ids: list[str] = field(default_factory=list)  # first scheduled or resumed
    preempted_req_ids: list[str] = field(default_factory=list)
    finished_req_ids: list[str] = field(default_factory=list)  # freed since the last step
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    swap_out_bytes: int = 0
    swap_in_bytes: int = 0
    # PD decode role: requests whose blocks were allocated this step and whose KV the
    # backend must now fetch: (request, number of prompt tokens already cached locally)
    kv_to_receive: list[tuple[Request, int]] = field(default_factory=list)
    # decode bursts (`simulator.core.decode_burst`): steps until each request reaches
    # max_tokens, noted by `max_decode_burst` for the burst's segments and update to reuse
    remaining: list[int] | None = None
    # each request's context before step 1 had step 1 been a decode (a prompt that step 1
    # completes decodes from there on): noted by the first of the burst functions to need it
    decode_before: list[int] | None = None

    @property
    def num_scheduled_tokens(self) -> int:
        return self.shape.num_tokens

    @property
    def is_empty(self) -> bool:
        return not self.reqs and not self.blocks_to_swap_out and not self.blocks_to_swap_in

    def add(self, req: Request, num_new_tokens: int, block_ids: list[int]) -> None:
        before = req.num_computed_tokens
        self.reqs.append(req)
        self.num_new_tokens.append(num_new_tokens)
        self.num_computed_before.append(before)
        self.block_ids.append(block_ids)
        self.shape.add(num_new_tokens, before)

    def remove(self, req: Request) -> int:
        """Unschedule `req` (it was preempted later in the same step); returns its tokens."""
        i = self.reqs.index(req)
        n = self.num_new_tokens[i]
        del self.reqs[i], self.num_new_tokens[i], self.num_computed_before[i], self.block_ids[i]
        self.shape = BatchShape.from_lists(self.num_new_tokens, self.num_computed_before,
                                           self.shape.window)
        return n


@dataclass(slots=True)
class StepResult:
    """What the executor reports for a `SchedulerOutput`.

    duration_s: time the step took (measured, or from a cost model).
    sampled_token_ids: one entry per scheduled request (ignored for those that do not
    sample); None when the backend produces no token ids (the simulator).
    step_end_times: for a multi-step decode burst (simulator only), the end time (s) of
    each of its steps; None for a single step.
    """

    duration_s: float
    sampled_token_ids: Sequence[int] | None = None
    step_end_times: Sequence[float] | None = None

    @property
    def num_steps(self) -> int:
        return 1 if self.step_end_times is None else len(self.step_end_times)
