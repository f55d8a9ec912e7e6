"""The PD proxy's routing policy: which prefill worker runs a request's prompt and which
decode worker receives its KV and decodes it.

Both choices are least-outstanding: the live worker of each role with the fewest requests
the front end has in flight on it (ties go to the lowest name, so routing is deterministic).
A request counts against its prefill worker until the hand-off and against its decode
worker from submission (its KV will need blocks there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any


class PDRouter:
    def pick(self, prefill: list[Any], decode: list[Any], in_flight: Iterable[Any]) -> tuple[Any, Any]:
        """(prefill worker, decode worker) for a new request; workers have `.name`, requests
        have `.worker`, `.prefill_worker` and `.decode_worker`."""
        on_prefill: Counter[str] = Counter()
        on_decode: Counter[str] = Counter()
        for r in in_flight:
            if r.worker == r.prefill_worker:
                on_prefill[r.prefill_worker] += 1
            on_decode[r.decode_worker] += 1
        p = min(prefill, key=lambda w: (on_prefill[w.name], w.name))
        d = min(decode, key=lambda w: (on_decode[w.name], w.name))
        return p, d
