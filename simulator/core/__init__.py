"""The clock-free core both backends run: requests, the paged KV cache with prefix
caching, the iteration-level scheduler and the engine step.

Imports neither simpy nor torch: time is a number passed in.
"""

from simulator.core.batch_shape import BatchShape
from simulator.core.block_pool import BlockPool, KVCacheBlock
from simulator.core.config import CacheConfig, SchedulerConfig
from simulator.core.engine import EngineCore, EngineStepOutput, Executor, IdealExecutor
from simulator.core.kv_cache_manager import KVCacheManager, KVCacheStats
from simulator.core.request import Request, RequestStatus, SamplingParams
from simulator.core.scheduler import Scheduler
from simulator.core.scheduler_output import SchedulerOutput, StepResult

__all__ = [
    "BatchShape",
    "BlockPool",
    "CacheConfig",
    "EngineCore",
    "EngineStepOutput",
    "Executor",
    "IdealExecutor",
    "KVCacheBlock",
    "KVCacheManager",
    "KVCacheStats",
    "Request",
    "RequestStatus",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "StepResult",
]
