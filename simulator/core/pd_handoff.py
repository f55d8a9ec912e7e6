"""The PD hand-off half of `Scheduler` (a mixin): a decode-role scheduler admits a request
whose prompt KV comes from a prefill worker, and either role moves it through the transfer
(`kv_to_receive` -> `on_kv_received` / `on_kv_failed`; `pop_kv_ready` ->
`release_transferred`). It reads the scheduler's queues, pool and capacity policy.
"""

from __future__ import annotations

from mypy_extensions import trait

from simulator.core.capacity import promise
from simulator.core.request import Request, RequestStatus
from simulator.core.scheduler_output import SchedulerOutput
from simulator.core.scheduler_state import SchedulerState

RUNNING = RequestStatus.RUNNING


@trait
class PDHandoff(SchedulerState):
    """Prefill/decode hand-off of a `Scheduler` (see the module docstring)."""

    def _admit_remote(self, req: Request, out: SchedulerOutput, reserved: int = 0) -> bool:
        """Decode role: allocate blocks for a request whose KV comes from a prefill worker
        (`reserved`: blocks promised to admitted requests, guaranteed_no_evict only)."""
        kvm = self.kv_cache_manager
        hits, num_hit = kvm.get_computed_blocks(req)
        if self._no_evict:
            if promise(kvm, req, hits, self.config.role) > kvm.num_free_blocks - reserved:
                return False
        else:
            # keep a watermark of free blocks (1% of the pool, as vLLM v0) so the requests
            # already decoding can grow without being preempted by each arrival
            need = kvm.blocks_needed(req.num_prompt_tokens) - len(hits)
            if kvm.num_free_blocks - need < max(1, kvm.num_gpu_blocks // 100) and self.running:
                return False
        if not kvm.allocate_slots(req, req.num_prompt_tokens - num_hit, hits, cache=False):
            return False  # back-pressure: the KV waits on the prefill side
        self.waiting.pop()
        req.num_computed_tokens = num_hit
        req.num_cached_tokens = num_hit
        self.waiting_for_kv[req.request_id] = req
        out.kv_to_receive.append((req, num_hit))
        return True

    def pop_kv_ready(self) -> list[Request]:
        """Prefill role: requests whose prompt is done and whose KV may now be sent."""
        ready, self._kv_ready = self._kv_ready, []
        return ready

    def release_transferred(self, request_id: str) -> None:
        """Prefill role: the decode side has the KV; free the blocks held for it."""
        req = self.transferring.pop(request_id)
        self.kv_cache_manager.free(req)
        self.requests.pop(request_id, None)
        self.finished_req_ids.append(request_id)

    def on_kv_received(self, request_id: str) -> None:
        """Decode role: the request's prompt KV is in its blocks; start decoding it."""
        req = self.waiting_for_kv.pop(request_id)
        req.num_computed_tokens = req.num_prompt_tokens
        self.kv_cache_manager.cache_full_blocks(req, req.num_prompt_tokens)
        req.status = RUNNING
        self.running.append(req)

    def on_kv_failed(self, request_id: str) -> None:
        """Decode role: the transfer was lost; recompute the prompt here (keeping the
        locally cached prefix and the blocks already allocated)."""
        req = self.waiting_for_kv.pop(request_id)
        req.status = RUNNING
        self.running.append(req)
