"""SGLang's `--scheduler-recv-interval` (`SchedulerConfig.recv_interval`): when arrivals reach
the waiting queue.

SGLang's scheduler loop receives new requests at the top of each iteration, but with an
interval N > 1 its `SchedulerRecvSkipper` (python/sglang/srt/managers/
scheduler_recv_skipper.py, read in the 0.5.12 wheel) lets them in only when a counter reaches
N. The counter grows by the weight of the batch run in the iteration before: 1 for a decode
batch or none (an idle loop), 1000 for anything else (a batch with prompt tokens:
SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DEFAULT), and restarts from 0 when it reaches N. So a
decoding engine takes arrivals in every N-th step, one that just ran prompt tokens takes
them at the next, and an idle one at once (its loop spins).

This module imports neither simpy nor the scheduler (the scheduler calls it).
"""

from __future__ import annotations

PROMPT_STEP_WEIGHT = 1000  # SGLang's weight of a batch that is neither decode nor idle


class RecvGate:
    """The counter of one scheduler: `opens` before each step, `stepped` after it."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.count = 0
        self.last_weight = 1  # the weight of the step before the next one (none yet: idle)

    def opens(self, idle: bool) -> bool:
        """Called once before each step: whether waiting arrivals are taken in now (`idle`:
        nothing runs or waits, so the loop spins up to the interval at once)."""
        self.count += self.last_weight
        if idle or self.count >= self.interval:
            self.count = 0
            return True
        return False

    def stepped(self, prompt_work: bool, steps: int = 1) -> None:
        """Record a step (`prompt_work`: it computed prompt tokens), or a decode burst of
        `steps` steps led by it: the checks before its steps 2..steps ran inside the burst."""
        weight = PROMPT_STEP_WEIGHT if prompt_work else 1
        if steps > 1:
            c = self.count + weight
            if c >= self.interval:
                c = 0
            self.count = (c + steps - 2) % self.interval  # (each reset lands on 0)
            weight = 1
        self.last_weight = weight

    def steps_before_open(self, prompt_work: bool) -> int:
        """How many steps from the one just scheduled (`prompt_work`: it computes prompt
        tokens) run before the check that takes arrivals in: a burst must end there when
        arrivals wait (>= 1)."""
        first = PROMPT_STEP_WEIGHT if prompt_work else 1
        return max(1, self.interval - self.count - first + 1)
