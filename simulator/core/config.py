"""Scheduler and KV-cache knobs, validated on construction (names follow vLLM)."""

from __future__ import annotations

from dataclasses import dataclass

BATCHING_MODES = ("continuous", "static")
PREEMPTION_MODES = ("recompute", "swap")
POLICIES = ("fcfs", "priority")
ROLES = ("colocated", "prefill", "decode")
# how the scheduler commits KV blocks: vLLM's admit-while-free-and-preempt, or TensorRT-LLM's
# GUARANTEED_NO_EVICT (reserve a request's whole length at admission, never preempt)
CAPACITY_POLICIES = ("max_utilization", "guaranteed_no_evict", "reserve_ratio")
# when a prompt takes its blocks: as each chunk runs (vLLM V1) or all at admission (vLLM V0)
PROMPT_ALLOCATIONS = ("per_chunk", "whole_prompt")


def _check_choice(field: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{field} must be one of {list(allowed)}, got {value!r}")


def check_min(field: str, value: object, minimum: int) -> None:
    """Refuse `value` unless it is an int (not a bool) of at least `minimum`, naming `field`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class CacheConfig:
    """The replica's KV pool: `num_gpu_blocks` device blocks of `block_size` tokens and
    `num_cpu_blocks` host blocks for swapping; `block_bytes` = one block's KV bytes.

    sliding_window: tokens the model's sliding-window layers attend to (0: none); batch
    shapes then carry the window-capped attention sums the cost model prices.
    free_outside_window: every attention layer slides (Mistral-7B-v0.1), so blocks that slid
    out of the window are freed (`KVCacheManager`). False for models that mix full-attention
    layers (gpt-oss, Gemma 2/3, Qwen2 with max_window_layers): one block table serves every
    layer, and the full layers read every block, so nothing is freed early. PD prefill and
    decode roles never free early either (the prompt's KV is handed over whole).
    state_blocks: blocks each request holds from its first allocation to its end besides its
    KV blocks: the recurrent state of a model's linear-attention layers (Qwen3-Next,
    Qwen3.5), which vLLM V1 keeps in the same pool as the KV blocks; 0 for other models.
    sliding_groups: for a model that mixes sliding-window and full-attention layers, the KV
    cache groups of its sliding layers under vLLM V1's hybrid KV cache manager (0: one block
    table serves every layer). A block then holds one group's layers, and a request holds,
    besides its table (the full-attention group's), `sliding_groups` blocks for each block
    position its sliding layers still read (`KVCacheManager`). Colocated replicas only (vLLM
    turns the manager off with a KV connector), recompute preemption only.
    """

    num_gpu_blocks: int
    block_size: int = 16
    num_cpu_blocks: int = 0
    enable_prefix_caching: bool = True
    block_bytes: int = 0
    sliding_window: int = 0
    free_outside_window: bool = False
    state_blocks: int = 0
    sliding_groups: int = 0

    def __post_init__(self) -> None:
        check_min("cache.block_size", self.block_size, 1)
        check_min("cache.num_gpu_blocks", self.num_gpu_blocks, 1)
        check_min("cache.num_cpu_blocks", self.num_cpu_blocks, 0)
        check_min("cache.block_bytes", self.block_bytes, 0)
        check_min("cache.sliding_window", self.sliding_window, 0)
        check_min("cache.state_blocks", self.state_blocks, 0)
        check_min("cache.sliding_groups", self.sliding_groups, 0)
        if self.sliding_groups and (not self.sliding_window or self.free_outside_window):
            raise ValueError("cache.sliding_groups: KV cache groups of sliding layers need a "
                             "model that mixes sliding-window (cache.sliding_window > 0) and "
                             "full-attention layers (free_outside_window false), got "
                             f"sliding_window {self.sliding_window}, free_outside_window "
                             f"{self.free_outside_window}")
        if self.sliding_groups and self.num_cpu_blocks:
            raise ValueError("cache.sliding_groups: swap preemption does not move the sliding "
                             "groups' blocks (vLLM V1 preempts by recompute); set "
                             "num_cpu_blocks 0")
        if self.state_blocks and self.enable_prefix_caching:
            raise ValueError("cache.state_blocks: a request's recurrent state (linear-attention "
                             "layers) is not cached by prefix; set enable_prefix_caching false")
        if self.state_blocks and self.num_cpu_blocks:
            raise ValueError("cache.state_blocks: swap preemption does not move a request's "
                             "recurrent state (linear-attention layers); preempt by recompute "
                             "(num_cpu_blocks 0)")


@dataclass(frozen=True)
class SchedulerConfig:
    """Iteration-level scheduling knobs.

    max_num_batched_tokens: token budget of one step (prompt chunks + decodes).
    long_prefill_token_threshold: cap on one request's prompt chunk per step (0 = off).
    batching: "continuous" (ORCA) or "static" (request-level: admit a new batch only
    when the previous one has fully finished).
    role: "colocated", or "prefill" / "decode" for PD disaggregation.
    capacity_policy: "max_utilization" (vLLM: admit while blocks are free, preempt the
    lowest-priority running request when one runs out) or "guaranteed_no_evict"
    (TensorRT-LLM's default: admit a request only when the blocks of its whole length,
    prompt + max_tokens, fit in the free blocks not already promised to admitted requests;
    never preempts, so `preemption_mode` has no effect), or "reserve_ratio" (SGLang's: admit a
    request when its prompt and output budget fit the free blocks less a decaying share of the
    running requests' remaining outputs; `simulator.core.capacity`). See `Scheduler`.
    mixed_batches: True (vLLM V1, TensorRT-LLM, LMDeploy): a step holds prompt tokens and
    decodes together. False (SGLang's default, vLLM V0 without chunked prefill): a colocated
    step runs prompts or decodes, never both; prompts first, whenever a chunk is pending or a
    waiting request can be admitted, while the running decodes wait.
    schedule_conservativeness: SGLang's --schedule-conservativeness under "reserve_ratio": its
    share of the running outputs starts at min(0.7 x this, 1) and falls to 0.14 x that start
    (`capacity.reserve_ratios`). SGLang with data-parallel attention runs 0.3 x its flag.
    first_token_from_decode: True (LMDeploy TurboMind before v0.1.0a2): a prompt's prefill
    stops one token short and its last token runs in the next step as a decode, which samples
    the first output token, so the first token costs a prefill plus a decode pass. False
    (everyone else): the step that computes the prompt's last token samples it.
    prompt_allocation: "per_chunk" (vLLM V1): a prompt takes blocks as its chunks run.
    "whole_prompt" (vLLM V0's BlockSpaceManager): a waiting request (a preempted one with its
    outputs) is admitted only when the blocks of all its tokens fit, and takes them all at
    once, so its later chunks take none and never preempt (where blocks slide out of a
    window, the admission check is capped at what its table holds at once and the blocks are
    taken per chunk).
    admission_watermark: the share of the pool an admission must leave free (vLLM V0's
    BlockSpaceManager watermark, 0.01: int(0.01 x blocks) blocks); 0: none. Running
    requests' growth ignores it.
    append_needs_free_block: True (vLLM V0's BlockSpaceManager.can_append_slots, which counts
    the block a step writes into as touched): a running request is scheduled only while a
    block is free, whether or not it needs a new one; with none free, the lowest-priority
    running request is preempted first. An admission then leaves at least one block free
    (V0's 1% watermark does in any pool of 100 blocks or more). False (vLLM V1): only a new
    block must be free.
    recv_interval: SGLang's --scheduler-recv-interval (colocated only). 1: arrivals reach the
    waiting queue before the next step. N > 1: SGLang's SchedulerRecvSkipper. Before each
    step a counter grows by the weight of the step before it (1 for an all-decode step, N for
    one with prompt tokens, which SGLang weighs 1000), and arrivals are taken in only when it
    reaches N (then it restarts from 0). So while the engine decodes, new requests wait for
    every N-th step. An idle engine takes them in at once: its loop spins.
    batch_wait_timeout_iters, batch_wait_max_tokens_ratio: TensorRT-LLM's batch waiting
    (`simulator.core.batch_wait`; mixed batches, colocated). In a step that decodes, waiting
    requests that could join are held back until the step count held reaches the timeout, or
    until their whole token counts plus one per decode reach the ratio x
    max_num_batched_tokens. The candidates are counted in queue order while seats and the
    step's tokens last, without the KV check; running prompt chunks are not held (TensorRT-LLM
    holds those too: they arise only with prompts longer than the step). Either at 0: off.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    preemption_mode: str = "recompute"
    policy: str = "fcfs"
    batching: str = "continuous"
    role: str = "colocated"
    capacity_policy: str = "max_utilization"
    mixed_batches: bool = True
    first_token_from_decode: bool = False
    schedule_conservativeness: float = 1.0
    prompt_allocation: str = "per_chunk"
    admission_watermark: float = 0.0
    append_needs_free_block: bool = False
    recv_interval: int = 1
    batch_wait_timeout_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0.0

    def __post_init__(self) -> None:
        check_min("scheduler.batch_wait_timeout_iters", self.batch_wait_timeout_iters, 0)
        if not 0.0 <= self.batch_wait_max_tokens_ratio <= 1.0:
            raise ValueError("scheduler.batch_wait_max_tokens_ratio must be in [0, 1], got "
                             f"{self.batch_wait_max_tokens_ratio!r}")
        if self.batch_waits and (self.role != "colocated" or not self.mixed_batches):
            raise ValueError("scheduler.batch_wait_timeout_iters / "
                             "scheduler.batch_wait_max_tokens_ratio "
                             "(TensorRT-LLM's batch waiting) apply to colocated replicas whose "
                             f"steps mix prompts and decodes, not role {self.role} with "
                             f"mixed_batches {self.mixed_batches}")
        check_min("scheduler.recv_interval", self.recv_interval, 1)
        if self.recv_interval > 1 and self.role != "colocated":
            raise ValueError(f"scheduler.recv_interval ({self.recv_interval}) applies to "
                             f"colocated replicas, not the {self.role} role")
        if not 0.0 <= self.admission_watermark < 1.0:
            raise ValueError("scheduler.admission_watermark must be in [0, 1), got "
                             f"{self.admission_watermark!r}")
        _check_choice("scheduler.prompt_allocation", self.prompt_allocation, PROMPT_ALLOCATIONS)
        if not self.schedule_conservativeness > 0:
            raise ValueError("scheduler.schedule_conservativeness must be > 0, got "
                             f"{self.schedule_conservativeness!r}")
        check_min("scheduler.max_num_seqs", self.max_num_seqs, 1)
        check_min("scheduler.max_num_batched_tokens", self.max_num_batched_tokens, 1)
        check_min("scheduler.max_model_len", self.max_model_len, 1)
        check_min("scheduler.long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        _check_choice("scheduler.preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _check_choice("scheduler.policy", self.policy, POLICIES)
        _check_choice("scheduler.batching", self.batching, BATCHING_MODES)
        _check_choice("scheduler.role", self.role, ROLES)
        _check_choice("scheduler.capacity_policy", self.capacity_policy, CAPACITY_POLICIES)

    @property
    def batch_waits(self) -> bool:
        """Whether batch waiting can hold anything (both knobs set)."""
        return self.batch_wait_timeout_iters > 0 and self.batch_wait_max_tokens_ratio > 0

    def validate_with(self, cache: CacheConfig) -> None:
        """Checks that involve both configs."""
        if self.max_num_batched_tokens < cache.block_size:
            raise ValueError(
                f"scheduler.max_num_batched_tokens ({self.max_num_batched_tokens}) must be at "
                f"least one block (cache.block_size = {cache.block_size} tokens)"
            )
        if cache.sliding_groups and self.role != "colocated":
            raise ValueError(
                f"cache.sliding_groups ({cache.sliding_groups}) apply to colocated replicas, "
                f"not the {self.role} role: vLLM turns its hybrid KV cache manager off with a "
                "KV connector, so a PD pool keeps one block table for every layer")
        if self.preemption_mode == "swap" and cache.num_cpu_blocks == 0:
            raise ValueError(
                "scheduler.preemption_mode 'swap' needs cache.num_cpu_blocks > 0 (a host pool)"
            )
