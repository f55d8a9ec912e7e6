"""TensorRT-LLM's batch waiting (`SchedulerConfig.batch_wait_timeout_iters` and
`batch_wait_max_tokens_ratio`): context requests wait for company.

TensorRT-LLM's PyExecutor (`_schedule` / `_waiting_requests`, tensorrt_llm/_torch/pyexecutor,
read through the code search) applies it after its capacity scheduler has picked an
iteration's requests, when they include both context (prompt) and generation requests and
attention DP is off. The context requests run only when the held-iteration count has reached
`batch_wait_timeout_iters`, or when their whole token counts plus one token per generation
request reach `batch_wait_max_tokens_ratio` x `max_num_tokens`; otherwise they are dropped
from the iteration and the count grows. It restarts when they run. With either knob at 0 the
test always passes: nothing waits.

This module imports neither simpy nor the scheduler (the scheduler calls it).
"""

from __future__ import annotations


class BatchWait:
    """The held-iteration count of one scheduler (`holds` for a step with both kinds of
    request; `burst` after a decode burst led by a held step)."""

    def __init__(self, timeout_iters: int, max_tokens: float) -> None:
        self.timeout_iters = timeout_iters
        self.max_tokens = max_tokens  # batch_wait_max_tokens_ratio x max_num_tokens
        self.iters = 0

    def holds(self, context_tokens: int, generation_tokens: int) -> bool:
        """Whether this step's context requests wait (counting the step), else run (the count
        restarts): `context_tokens` their whole token counts, `generation_tokens` one per
        generation request."""
        if (self.iters >= self.timeout_iters
                or context_tokens + generation_tokens >= self.max_tokens):
            self.iters = 0
            return False
        self.iters += 1
        return True

    def steps_before_release(self) -> int:
        """How many steps from a held one (it included) also hold, nothing else changing: a
        burst from it must end before the step that lets the context requests run (>= 1)."""
        return max(1, self.timeout_iters - self.iters + 1)

    def burst(self, steps: int, tokens: int) -> None:
        """Apply the checks of steps 2..`steps` of a decode burst whose steps all had waiting
        requests that could join, at `tokens` (context + generation, the same every step: no
        arrival or finish inside a burst while requests wait). Each check holds (the count
        grows) or, at the timeout, lets them try to run (the count restarts; they do not get
        in, or the burst would have ended before: `steps_before_release`)."""
        if tokens >= self.max_tokens:
            self.iters = 0
        else:
            self.iters = (self.iters + steps - 1) % (self.timeout_iters + 1)
