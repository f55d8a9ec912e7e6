"""Routers (the global scheduler): pick the replica for each arriving request.

- round_robin: in turn.
- least_outstanding_tokens: fewest prompt + max output tokens assigned and unfinished.
- least_kv_usage: lowest fraction of KV blocks in use.
- prefix_aware: the replica whose prefix cache holds the longest prefix of the request,
  unless its outstanding tokens exceed `load_cap` x the least-loaded replica's (plus one
  request's worth); ties and capped cases fall back to least outstanding tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

from simulator.core.request import Request
from simulator.scenario import RouterPolicy

ROUTERS: tuple[str, ...] = get_args(RouterPolicy)


class Router:
    def __init__(self, replicas: Sequence, policy: str = "round_robin", load_cap: float = 1.5) -> None:
        if policy not in ROUTERS:
            raise ValueError(f"router must be one of {list(ROUTERS)}, got {policy!r}")
        if not replicas:
            raise ValueError("a router needs at least one replica")
        if load_cap < 1.0:
            raise ValueError(f"router load_cap must be >= 1.0, got {load_cap}")
        self.replicas = list(replicas)
        self.policy = policy
        self.load_cap = load_cap
        self._next = 0

    def route(self, req: Request):
        reps = self.replicas
        if len(reps) == 1:
            return reps[0]
        if self.policy == "round_robin":
            rep = reps[self._next % len(reps)]
            self._next += 1
            return rep
        if self.policy == "least_kv_usage":
            return min(reps, key=lambda r: (r.kv_usage, r.outstanding_tokens))
        least = min(reps, key=lambda r: r.outstanding_tokens)
        if self.policy == "least_outstanding_tokens":
            return least
        best, best_hit = least, 0
        for rep in reps:
            _, hit = rep.scheduler.kv_cache_manager.get_computed_blocks(req)
            if hit > best_hit:
                best, best_hit = rep, hit
        cap = self.load_cap * least.outstanding_tokens + req.num_prompt_tokens + req.max_tokens
        return best if best.outstanding_tokens <= cap else least
