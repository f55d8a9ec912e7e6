"""vLLM V1's host time per scheduled request per step, where the GPU waits for it.

V1's engine core steps as `schedule()` -> the model's step -> `update_from_output()`, and both
loop over the step's requests in Python. With synchronous scheduling, V1's default from v0.8.0
(the first release with V1 as the default engine) until v0.14.0 (async scheduling on by
default: the next step is scheduled while the GPU runs this one), the GPU idles through that
work: `cluster.host_request_s` seconds per scheduled request, added to every step.

The price, `VLLM_V1_HOST_REQUEST_S`: the released 0.11.0 wheel's `Scheduler.schedule()` +
`update_from_output()` timed on the CPU in steady decoding of 16, 64, 256, 1,024 and 3,200
requests (`bench/diagnostics/vllm_host_cost.py`): 4.9-5.5 us per request up to 256, 5.0-6.5
at 1,024 and 6.4-8.6 at 3,200 over three runs on this repository's machine, whose means (5.3,
5.5 and 6.1 us) set it to 5.5 us (vLLM PR #46112 timed `update_from_output` alone about 1.26x
faster on its machine). Only the scheduler: the model runner's input preparation and the
sampler's bookkeeping also loop over requests between steps and are not in it, so the price
is a lower bound. From v0.14 kvpd leaves it out (it hides behind the GPU step as long
as it is shorter; not checked). V0 (before v0.8.0) is not priced here.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from simulator.engines.version import parse_version

VLLM_V1_HOST_REQUEST_S = 5.5e-6  # s per scheduled request per step (see above)
VLLM_SYNC_V1_FROM = Version("0.8.0")  # V1 the default engine
VLLM_ASYNC_FROM = Version("0.14.0")  # SchedulerConfig.async_scheduling on where supported


def host_request_rule(cluster: dict[str, Any], version: Any) -> list[str]:
    """`cluster.host_request_s` for a vLLM scenario whose release schedules V1 synchronously,
    where the key is not set; the rule used, as a note (none otherwise)."""
    v = parse_version(version)
    if "host_request_s" in cluster or v is None or not VLLM_SYNC_V1_FROM <= v < VLLM_ASYNC_FROM:
        return []
    cluster["host_request_s"] = VLLM_V1_HOST_REQUEST_S
    return [f"cluster.host_request_s {VLLM_V1_HOST_REQUEST_S * 1e6:.1f} us: vLLM {version}'s "
            "V1 engine schedules synchronously, its scheduler's Python work per request "
            "between steps (schedule and update_from_output, timed from the 0.11.0 wheel) "
            "added to every step (simulator/engines/vllm_host.py)"]
