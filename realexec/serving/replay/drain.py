"""The warm-up drain of a replay (`kvpd replay --warmup-drain`, the simulator's
`workload.warmup_drain`): the measured requests go once every warm-up request has finished."""

from __future__ import annotations


def shift_after_drain(send_s: list[float], drain: int, now_s: float) -> None:
    """Move the send times of requests `drain` on (`send_s`, in place, on the clock of `now_s`,
    the moment the last warm-up request finished) by the wait: the first measured request goes at
    max(its time, `now_s`) and the later ones keep their gaps to it."""
    shift = max(0.0, now_s - send_s[drain])
    for j in range(drain, len(send_s)):
        send_s[j] += shift
