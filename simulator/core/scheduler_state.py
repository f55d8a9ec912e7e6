"""`SchedulerState`: the scheduler state its mixins read, declared once.

`PDHandoff` and `ParallelSampling` are halves of `Scheduler` kept in files of their own. They
are mypyc traits (mixins the compiled core can mix in, `simulator.native`), so the state they
read is declared here, set by `Scheduler.__init__`, and laid out once when compiled.
"""

from __future__ import annotations

from mypy_extensions import trait

from simulator.core.config import SchedulerConfig
from simulator.core.kv_cache_manager import KVCacheManager
from simulator.core.request import Request
from simulator.core.request_queue import FCFSQueue, PriorityQueue


@trait
class SchedulerState:
    config: SchedulerConfig
    kv_cache_manager: KVCacheManager
    block_size: int
    running: list[Request]
    waiting: FCFSQueue | PriorityQueue
    waiting_for_kv: dict[str, Request]  # decode role: blocks held, KV in flight
    transferring: dict[str, Request]  # prefill role: handed off, blocks held
    requests: dict[str, Request]
    finished_req_ids: list[str]
    _pending_copies: list[tuple[int, int]]
    _kv_ready: list[Request]
    _no_evict: bool
    _kept: int  # blocks admissions leave free beside what is promised (Scheduler.__init__)
