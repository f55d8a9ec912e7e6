"""vLLM's host time per scheduled request per step, and whether the GPU waits for it.

V1's engine core steps as `schedule()` -> the model's step -> `update_from_output()`, and both
loop over the step's requests in Python: `cluster.host_request_s` seconds per scheduled
request. With synchronous scheduling, V1's default from v0.8.0 (the first release with V1 as
the default engine) until v0.14.0, the GPU idles through that work: it adds to every step.
From v0.14.0 async scheduling is on by default (`cluster.async_scheduling`): the next step is
scheduled while the GPU runs this one, so the work counts only where it outlasts the step
(small models at large batches; `CostModel.with_scheduler_host`).

The price, `VLLM_V1_HOST_REQUEST_S`: the released 0.11.0 wheel's `Scheduler.schedule()` +
`update_from_output()` timed on the CPU in steady decoding of 16, 64, 256, 1,024 and 3,200
requests (`bench/diagnostics/vllm_host_cost.py`): 4.9-5.5 us per request up to 256, 5.0-6.5
at 1,024 and 6.4-8.6 at 3,200 over three runs on this repository's machine, whose means (5.3,
5.5 and 6.1 us) set it to 5.5 us (vLLM PR #46112 timed `update_from_output` alone about 1.26x
faster on its machine). Only the scheduler: the model runner's input preparation and the
sampler's bookkeeping also loop over requests between steps and are not in it, so the price
is a lower bound; the 0.17.0 wheel's scheduler times alike (0.18 / 0.36 ms of
`update_from_output` at 128 / 256 requests).

V0 (before v0.8.0) is synchronous too: `LLMEngine.step` runs `Scheduler.schedule()`, which also
builds every scheduled group's `SequenceGroupMetadata`, and, with output processing async (its
default on CUDA and ROCm), appends each step's tokens (`_advance_to_next_step`) before the
next one; the GPU waits for both. `VLLM_V0_HOST_REQUEST_S`: the released 0.7.3 wheel's two
timed alike (`vllm_host_cost.py --engine v0`) in steady decoding of 16-256 requests (V0's
default max_num_seqs): 9.3-10.5 us per request over three runs on this repository's machine
(schedule 7.8-8.7 us, append 1.6-1.8 us; 9.6-12.8 us at 1,024), priced at 10 us, about
twice V1's. Also a lower bound: the model runner's input preparation is not in it, and the
output processing that runs beside the GPU's step (detokenization, request outputs) counts
only where it outlasts the step, which is not priced.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from simulator.engines.version import from_release

VLLM_V1_HOST_REQUEST_S = 5.5e-6  # s per scheduled request per step (see above)
VLLM_V0_HOST_REQUEST_S = 10.0e-6  # s per scheduled request per step, V0 (see above)
VLLM_V1_RELEASE = Version("0.8.0")  # V1 the default engine (presets.VLLM_V1_FROM reads it)
VLLM_ASYNC_FROM = Version("0.14.0")  # SchedulerConfig.async_scheduling on where supported


def host_request_rule(cluster: dict[str, Any], version: Any) -> list[str]:
    """`cluster.host_request_s` and `cluster.async_scheduling` for a vLLM scenario, where they
    are not set: V0's price before 0.8.0, V1's from it (`version` None: the current release);
    the rules used, as notes."""
    v1 = from_release(version, VLLM_V1_RELEASE)
    notes = []
    asynchronous = v1 and from_release(version, VLLM_ASYNC_FROM)
    if "async_scheduling" not in cluster:
        cluster["async_scheduling"] = asynchronous
        notes.append(f"cluster.async_scheduling {str(asynchronous).lower()}: vLLM "
                     f"{version or '(current)'} " + ("schedules the next step while the GPU "
                     "runs this one (the default from 0.14.0)" if asynchronous else
                     "schedules synchronously (V1 before 0.14.0)" if v1 else
                     "schedules synchronously (its V0 engine)"))
    if "host_request_s" not in cluster:
        price = VLLM_V1_HOST_REQUEST_S if v1 else VLLM_V0_HOST_REQUEST_S
        cluster["host_request_s"] = price
        notes.append(f"cluster.host_request_s {price * 1e6:.1f} us: vLLM " + (
            "V1's scheduler (schedule and update_from_output, timed from the 0.11.0 wheel)" if v1
            else "V0's scheduler and token append (schedule and _advance_to_next_step, timed "
            "from the 0.7.3 wheel)") + " per request between steps (simulator/engines/vllm_host.py)")
    return notes
