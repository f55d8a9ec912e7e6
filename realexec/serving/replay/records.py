"""A replayed request as a finished core `Request` carrying client-side timestamps, so a real
replay writes the same records and summary as a simulation."""

from __future__ import annotations

from array import array
from typing import Any

from simulator.core.request import Request, RequestStatus, SamplingParams


def request_record(i: int, prompt: list[int], n_out: int, arrival: float, token_ids: list[int],
            token_times: list[float], finish_reason: str | None, error: str | None,
            cached: int = 0, first_scheduled: float | None = None,
            annotations: dict[str, Any] | None = None, preemptions: int = 0,
            stop_reason: str | None = None) -> Request:
    """A finished core `Request` carrying client-side timestamps (s since the replay start).
    `preemptions`: how often the engine preempted it; `first_scheduled`: when the first step
    of the engine that ran its prompt began (both in process, as the ZMQ workers report
    them, or from kvpd's HTTP extension field; None / 0 when not reported); `stop_reason`:
    why the engine rejected it, when it says."""
    req = Request(str(i), prompt_token_ids=prompt,
                  sampling_params=SamplingParams(temperature=0.0, max_tokens=n_out, ignore_eos=True),
                  arrival_time=arrival)
    req.output_token_ids = list(token_ids)
    req.num_output_tokens = len(token_times)
    req.token_times = array("d", token_times)
    req.first_token_time = token_times[0] if token_times else None
    req.first_scheduled_time = first_scheduled
    req.num_cached_tokens = cached
    req.num_preemptions = preemptions
    req.annotations.update(annotations or {})
    end = token_times[-1] if token_times else arrival
    if error is not None:
        req.finish(RequestStatus.FINISHED_ABORTED, end, error)
    elif finish_reason == "stop":
        req.finish(RequestStatus.FINISHED_STOPPED, end)
    elif finish_reason == "length":
        req.finish(RequestStatus.FINISHED_LENGTH, end)
    elif finish_reason == "rejected":
        req.finish(RequestStatus.FINISHED_REJECTED, end, stop_reason)
    else:
        req.finish(RequestStatus.FINISHED_ABORTED, end, finish_reason)
    return req
