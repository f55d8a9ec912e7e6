"""vLLM V1's host time per scheduled request per step, and whether the GPU waits for it.

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
`update_from_output` at 128 / 256 requests). V0 (before v0.8.0) is not priced here.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from simulator.engines.version import from_release

VLLM_V1_HOST_REQUEST_S = 5.5e-6  # s per scheduled request per step (see above)
VLLM_SYNC_V1_FROM = Version("0.8.0")  # V1 the default engine
VLLM_ASYNC_FROM = Version("0.14.0")  # SchedulerConfig.async_scheduling on where supported


def host_request_rule(cluster: dict[str, Any], version: Any) -> list[str]:
    """`cluster.host_request_s` and `cluster.async_scheduling` for a vLLM scenario on the V1
    engine (`version` from 0.8.0; None: the current release), where they are not set; the
    rules used, as notes (none for V0)."""
    if not from_release(version, VLLM_SYNC_V1_FROM):
        return []
    notes = []
    asynchronous = from_release(version, VLLM_ASYNC_FROM)
    if "async_scheduling" not in cluster:
        cluster["async_scheduling"] = asynchronous
        notes.append(f"cluster.async_scheduling {str(asynchronous).lower()}: vLLM "
                     f"{version or '(current)'} " + ("schedules the next step while the GPU "
                     "runs this one (the default from 0.14.0)" if asynchronous else
                     "schedules synchronously (V1 before 0.14.0)"))
    if "host_request_s" not in cluster:
        cluster["host_request_s"] = VLLM_V1_HOST_REQUEST_S
        notes.append(f"cluster.host_request_s {VLLM_V1_HOST_REQUEST_S * 1e6:.1f} us: vLLM V1's "
                     "scheduler (schedule and update_from_output, timed from the 0.11.0 wheel) "
                     "per request between steps (simulator/engines/vllm_host.py)")
    return notes
