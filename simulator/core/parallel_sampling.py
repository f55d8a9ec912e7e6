"""Parallel sampling (`SamplingParams.n` > 1) for `Scheduler` (a mixin): once the parent has
computed all but its last prompt token, n - 1 children fork from it sharing its KV blocks
(copy-on-write of the last partial block), or wait to recompute when no block is free or
(guaranteed_no_evict) their length is not promised.
"""

from __future__ import annotations

import dataclasses

from mypy_extensions import trait

from simulator.core.capacity import blocks_to_completion, max_kv_tokens, reserved_blocks
from simulator.core.request import Request, RequestStatus
from simulator.core.scheduler_state import SchedulerState

RUNNING = RequestStatus.RUNNING


@trait
class ParallelSampling(SchedulerState):
    """Forking of parallel-sampling children in a `Scheduler` (see the module docstring)."""

    def _make_children(self, parent: Request) -> list[Request]:
        sp = parent.sampling_params
        n = sp.n
        parent.num_forked = n - 1
        children = []
        for i in range(1, n):
            child_sp = dataclasses.replace(
                sp, n=1, seed=None if sp.seed is None else sp.seed + i
            )
            children.append(
                Request(
                    request_id=f"{i}_{parent.request_id}",
                    prompt_token_ids=parent.prompt_token_ids,
                    sampling_params=child_sp,
                    arrival_time=parent.arrival_time,
                    num_prompt_tokens=parent.num_prompt_tokens,
                    prompt_hash_ids=parent.prompt_hash_ids,
                    hash_block_size=parent.hash_block_size,
                    eos_token_id=parent.eos_token_id,
                    priority=parent.priority,
                    parent_request_id=parent.request_id,
                )
            )
        return children

    def _fork(self, parent: Request) -> None:
        """Parent computed all but its last prompt token: start n-1 children sharing its KV."""
        kvm = self.kv_cache_manager
        no_evict = self._no_evict
        role = self.config.role
        if no_evict:  # a child runs only if its length beyond the shared blocks is promised
            reserved = reserved_blocks(kvm, self.running, self.waiting_for_kv.values(),
                                       role) + self._kept
            shared = parent.num_computed_tokens // self.block_size  # table entries it shares
        for child in self._make_children(parent):
            child.first_scheduled_time = parent.first_scheduled_time
            child.num_cached_tokens = parent.num_cached_tokens
            self.requests[child.request_id] = child
            child.num_computed_tokens = parent.num_computed_tokens
            if no_evict and (  # (the fork copies the parent's recurrent state, if any)
                kvm.blocks_to_grow(max_kv_tokens(child, role), shared,
                                   request_id=child.request_id) > kvm.num_free_blocks - reserved
            ):
                copies = None
            else:
                copies = kvm.fork(parent, child)
            if copies is None:  # no block for the copy: recompute the child later
                child.num_computed_tokens = 0
                self.waiting.add(child)
                continue
            self._pending_copies.extend(copies)
            child.status = RUNNING
            self.running.append(child)
            if no_evict:
                reserved += blocks_to_completion(kvm, child, role)
