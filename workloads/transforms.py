"""Trace transforms: each takes a `Trace` and returns a new one (inputs are not modified).

- `scale_time(trace, factor)`: multiply every arrival time by `factor`
- `rescale_rate(trace, rate_rps)`: scale time so the mean rate len/duration_s is `rate_rps`
  (inter-arrival gaps keep their shape, so bursts stay bursts)
- `time_window(trace, start_s, end_s, rebase=True)`: requests with start_s <= arrival < end_s
- `first_n(trace, n)`: the first `n` requests
- `limit_prompt_len(trace, max_model_len, mode="reject"|"clip")`: drop (vLLM rejects) or
  truncate prompts longer than `max_model_len` tokens
- `jitter_arrivals(trace, step_s=None, seed=0)`: spread arrivals recorded in coarse steps
  uniformly over [t, t + step_s), keeping their order
- `scale_lengths(trace, prompt=1.0, output=1.0)`: multiply lengths (rounded, >= 1 token)
- `merge_traces(traces, name=None)`: interleave by arrival time
- `retime(trace, arrival, seed=0)`: new arrival times from an arrival process
  (`workloads.arrivals`, e.g. `{"process": "burst"}`: all at t = 0), rows kept in order

Row-dropping transforms add their drops to a copy of the trace's `load_report`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from workloads.arrivals import arrival_times, validate_arrival
from workloads.errors import LoadReport, TraceWarning
from workloads.ragged import Ragged
from workloads.trace import Trace


def _report_drop(trace: Trace, keep: np.ndarray, reason: str) -> LoadReport:
    report = (
        trace.load_report.copy()
        if trace.load_report is not None
        else LoadReport(trace.name, "trace", rows_read=len(trace), rows_kept=len(trace))
    )
    report.drop(reason, int(len(trace) - keep.sum()))
    return report


def _keep(trace: Trace, keep: np.ndarray, reason: str) -> Trace:
    report = _report_drop(trace, keep, reason)
    return trace.take(keep).replace(load_report=report)


def scale_time(trace: Trace, factor: float) -> Trace:
    """Arrival times times `factor` (> 0): the duration scales by exactly `factor`."""
    if not factor > 0 or not np.isfinite(factor):
        raise ValueError(f"scale_time: factor must be a finite number > 0, got {factor!r}")
    return trace.replace(arrival_s=trace.arrival_s * factor)


def mean_rate(trace: Trace) -> float:
    """Mean request rate, requests/s: len(trace) / duration_s."""
    if len(trace) < 2 or trace.duration_s <= 0:
        raise ValueError(
            f"trace {trace.name!r}: needs two or more distinct arrival times for a rate"
        )
    return len(trace) / trace.duration_s


def rescale_rate(trace: Trace, rate_rps: float) -> Trace:
    """Scale time so that len / duration_s == `rate_rps`; the order and gap shape are kept."""
    if not rate_rps > 0 or not np.isfinite(rate_rps):
        raise ValueError(f"rescale_rate: rate_rps must be a finite number > 0, got {rate_rps!r}")
    return scale_time(trace, mean_rate(trace) / rate_rps)


def time_window(trace: Trace, start_s: float, end_s: float, *, rebase: bool = True) -> Trace:
    """Requests with start_s <= arrival_s < end_s; with `rebase`, times shift by -start_s."""
    if not end_s > start_s:
        raise ValueError(f"time_window: need end_s > start_s, got {start_s!r}..{end_s!r}")
    lo, hi = np.searchsorted(trace.arrival_s, [start_s, end_s], side="left")
    keep = np.zeros(len(trace), dtype=bool)
    keep[lo:hi] = True
    out = _keep(trace, keep, f"outside time window [{start_s:g}, {end_s:g}) s")
    if rebase:
        out = out.replace(arrival_s=np.maximum(out.arrival_s - max(start_s, 0.0), 0.0))
    return out


def first_n(trace: Trace, n: int) -> Trace:
    """The first `n` requests (all of them if the trace is shorter)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"first_n: n must be an integer >= 0, got {n!r}")
    keep = np.arange(len(trace)) < n
    return _keep(trace, keep, f"beyond the first {n} requests")


def _truncate_prompts(trace: Trace, new_len: np.ndarray) -> Trace:
    """Prompts cut to `new_len` tokens; hash ids and token ids cut to match."""
    hashes = trace.hash_ids
    if hashes is not None:
        hashes = hashes.truncate(-(-new_len // trace.hash_block_size))
    tokens = trace.prompt_token_ids
    if tokens is not None:
        tokens = tokens.truncate(new_len)
    return trace.replace(prompt_len=new_len, hash_ids=hashes, prompt_token_ids=tokens)


def limit_prompt_len(trace: Trace, max_model_len: int, *, mode: str = "reject") -> Trace:
    """Prompts over `max_model_len` tokens: `reject` drops them (as vLLM rejects such
    requests), `clip` keeps their first `max_model_len` tokens (and matching hashes/ids).
    Output lengths are left alone; the scheduler caps prompt + output at max_model_len."""
    if (
        isinstance(max_model_len, bool)
        or not isinstance(max_model_len, (int, np.integer))
        or max_model_len < 1
    ):
        raise ValueError(
            f"limit_prompt_len: max_model_len must be an integer >= 1, got {max_model_len!r}"
        )
    if mode == "reject":
        keep = trace.prompt_len <= max_model_len
        return _keep(trace, keep, f"prompt_len > max_model_len ({max_model_len})")
    if mode == "clip":
        return _truncate_prompts(trace, np.minimum(trace.prompt_len, max_model_len))
    raise ValueError(f"limit_prompt_len: mode must be 'reject' or 'clip', got {mode!r}")


def coarse_step(trace: Trace) -> float:
    """The smallest positive gap between arrival times (s): the step of a coarsely stamped trace."""
    gaps = np.diff(trace.arrival_s)
    gaps = gaps[gaps > 0]
    if not len(gaps):
        raise ValueError(
            f"trace {trace.name!r}: no two distinct arrival times to infer a step from"
        )
    return float(gaps.min())


def jitter_arrivals(trace: Trace, step_s: float | None = None, *, seed: int = 0) -> Trace:
    """Spread each arrival uniformly over [t, t + step_s), keeping the original order.

    For traces stamped in coarse steps (one Mooncake trace rounds to ~3 s). `step_s`
    defaults to the smallest positive gap (`coarse_step`). Requests sharing a stamp get
    sorted offsets, so the file order within a step (e.g. turns of a conversation) holds.
    """
    step = coarse_step(trace) if step_s is None else step_s
    if not step > 0 or not np.isfinite(step):
        raise ValueError(f"jitter_arrivals: step_s must be a finite number > 0, got {step_s!r}")
    rng = np.random.default_rng(seed)
    offsets = rng.uniform(0.0, step, size=len(trace))
    _, group = np.unique(trace.arrival_s, return_inverse=True)
    order = np.lexsort((offsets, group))
    arrival = trace.arrival_s + offsets[order]
    # Stamps closer than `step` could overlap; keep the trace sorted in the original order.
    return trace.replace(arrival_s=np.maximum.accumulate(arrival))


def scale_lengths(trace: Trace, prompt: float = 1.0, output: float = 1.0) -> Trace:
    """Prompt and output lengths times the factors, rounded, at least 1 token.

    Prompt factors < 1 cut hash ids / token ids to match; factors > 1 on a trace with
    them raise ValueError (the added tokens would have no content).
    """
    for label, f in (("prompt", prompt), ("output", output)):
        if not f > 0 or not np.isfinite(f):
            raise ValueError(
                f"scale_lengths: {label} factor must be a finite number > 0, got {f!r}"
            )
    new_prompt = np.maximum(np.rint(trace.prompt_len * prompt), 1).astype(np.int64)
    new_output = np.maximum(np.rint(trace.output_len * output), 1).astype(np.int64)
    if prompt > 1 and (trace.hash_ids is not None or trace.prompt_token_ids is not None):
        raise ValueError(
            "scale_lengths: cannot lengthen prompts of a trace with hash_ids/prompt_token_ids; "
            "drop them first (trace.replace(hash_ids=None, hash_block_size=None, prompt_token_ids=None))"
        )
    out = trace.replace(output_len=new_output)
    if prompt != 1:
        out = _truncate_prompts(
            out, np.minimum(new_prompt, trace.prompt_len) if prompt < 1 else new_prompt
        )
    return out


def merge_traces(traces: Sequence[Trace], *, name: str | None = None) -> Trace:
    """All requests of `traces`, stably ordered by arrival time (times are not shifted).

    Hash ids and session ids of each later trace are offset past the earlier ones'
    maxima so the traces never share a prefix block or a session by accident. An
    optional column is kept only if every trace has it; hash block sizes must agree.
    """
    if not traces:
        raise ValueError("merge_traces: need at least one trace")
    arrival = np.concatenate([t.arrival_s for t in traces])
    order = np.argsort(arrival, kind="stable")
    cat = lambda attr: np.concatenate([getattr(t, attr) for t in traces])[order]  # noqa: E731
    session = hashes = tokens = None
    block = None
    for attr in ("session_id", "hash_ids", "prompt_token_ids"):
        have = [getattr(t, attr) is not None for t in traces]
        if any(have) and not all(have):
            warnings.warn(
                f"merge_traces: {attr} dropped: only {sum(have)} of {len(traces)} traces have it",
                TraceWarning,
                stacklevel=2,
            )
    if all(t.session_id is not None for t in traces):
        session = _offset_concat([t.session_id for t in traces])[order]
    if all(t.hash_ids is not None for t in traces):
        sizes = {t.hash_block_size for t in traces}
        if len(sizes) != 1:
            raise ValueError(f"merge_traces: hash block sizes differ: {sorted(sizes)}")
        block = sizes.pop()
        values = _offset_concat([t.hash_ids.values for t in traces])
        lengths = np.concatenate([t.hash_ids.lengths() for t in traces])
        hashes = Ragged.from_lengths(values, lengths).take(order)
    if all(t.prompt_token_ids is not None for t in traces):
        tokens = Ragged.concat([t.prompt_token_ids for t in traces]).take(order)
    return Trace(
        arrival_s=arrival[order],
        prompt_len=cat("prompt_len"),
        output_len=cat("output_len"),
        name=name or "+".join(t.name for t in traces),
        session_id=session,
        hash_ids=hashes,
        hash_block_size=block,
        prompt_token_ids=tokens,
    )


def _offset_concat(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate integer arrays; each after the first is shifted past the ids before it."""
    out: list[np.ndarray] = []
    base = 0
    for p in parts:
        if len(p):
            out.append(p if not out else p - p.min() + base)
            base = int(out[-1].max()) + 1
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def retime(trace: Trace, arrival: dict, seed: int = 0, where: str = "arrival") -> Trace:
    """The trace with arrival times drawn from the arrival process `arrival` (a mapping as
    `workloads.arrivals` defines, checked and named `where` in errors), one per row in the
    trace's order; lengths, prefixes and token ids stay. `{"process": "burst"}` puts every
    request at t = 0."""
    spec = validate_arrival(arrival, where)
    times = arrival_times(spec, np.random.default_rng(seed), num_requests=len(trace))
    return trace.replace(arrival_s=times)
