"""Sliding-window KV: the core frees blocks that slid out of the window (every layer slides).

A shadow backend replays each step's copies and KV writes into a per-slot record of which
prefix each slot holds, and checks that every key a step reads (the window of each new
token) sits in a live block of the request's table holding exactly that request's prefix:
so no block that a later step reads was freed (and reused), prefix hits and swaps bring the
right content back, and the pool is whole at the end.
"""

from __future__ import annotations

import random
from itertools import accumulate

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simulator import native
from simulator.core import (
    CacheConfig,
    Request,
    RequestStatus,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
    StepResult,
)
from simulator.core.block_pool import NULL_BLOCK_ID
from tests.core_helpers import workload_requests

knobs = st.fixed_dictionaries(
    {
        "block_size": st.sampled_from([1, 2, 4, 8]),
        "window": st.integers(1, 24),
        "num_gpu_blocks": st.integers(6, 40),
        "num_cpu_blocks": st.integers(0, 40),
        "budget_blocks": st.integers(1, 6),
        "max_num_seqs": st.integers(1, 6),
        "chunked": st.booleans(),
        "threshold": st.sampled_from([0, 0, 3, 7]),
        "swap": st.booleans(),
        "policy": st.sampled_from(["fcfs", "priority"]),
        "caching": st.booleans(),
        "capacity": st.sampled_from(["max_utilization", "max_utilization", "guaranteed_no_evict"]),
        "mixed": st.sampled_from([True, True, False]),
        "whole_prompt": st.sampled_from([False, False, True]),  # vLLM V0's admission
    }
)
workload = st.lists(
    st.tuples(
        st.integers(1, 60),  # prompt length
        st.integers(1, 20),  # max tokens
        st.integers(0, 3),  # shared-prefix family
        st.floats(0, 0.2),  # arrival gap (s)
        st.sampled_from([1, 1, 1, 2, 3]),  # n
    ),
    min_size=1,
    max_size=12,
)


def build(k, wl, seed, window=True):
    cache = CacheConfig(
        num_gpu_blocks=k["num_gpu_blocks"], block_size=k["block_size"],
        num_cpu_blocks=k["num_cpu_blocks"] if k["swap"] else 0,
        enable_prefix_caching=k["caching"],
        sliding_window=k["window"] if window else 0, free_outside_window=window,
    )
    cfg = SchedulerConfig(
        max_num_seqs=k["max_num_seqs"],
        max_num_batched_tokens=k["budget_blocks"] * 8 + k["block_size"],
        max_model_len=128,
        enable_chunked_prefill=k["chunked"],
        long_prefill_token_threshold=k["threshold"],
        preemption_mode="swap" if k["swap"] and k["num_cpu_blocks"] else "recompute",
        policy=k["policy"],
        capacity_policy=k["capacity"],
        mixed_batches=k.get("mixed", True),
        prompt_allocation="whole_prompt" if k.get("whole_prompt") else "per_chunk",
        admission_watermark=0.1 if k.get("whole_prompt") else 0.0,
        append_needs_free_block=bool(k.get("whole_prompt")),
    )
    return Scheduler(cfg, cache), workload_requests(wl, seed, prefix_len=50)


class ShadowBackend:
    """Records, per device and host slot, the prefix (tuple of token ids) whose last token's
    KV it holds; checks every read against the reading request's own tokens."""

    def __init__(self, sched: Scheduler, seed: int, ids: bool = True) -> None:
        self.sched = sched
        self.bs = sched.block_size
        self.window = sched.kv_cache_manager.sliding_window
        self.device: dict[int, tuple] = {}
        self.host: dict[int, tuple] = {}
        self.rng = random.Random(seed)
        self.ids = ids

    def _copy(self, pairs, src: dict, dst: dict) -> None:
        bs = self.bs
        for s, d in pairs:
            for o in range(bs):
                if s * bs + o in src:
                    dst[d * bs + o] = src[s * bs + o]
                else:
                    dst.pop(d * bs + o, None)

    def execute(self, out: SchedulerOutput) -> StepResult:
        kvm = self.sched.kv_cache_manager
        self._copy(out.blocks_to_copy, self.device, self.device)
        self._copy(out.blocks_to_swap_out, self.device, self.host)
        self._copy(out.blocks_to_swap_in, self.host, self.device)
        for req, ids, c, q in zip(out.reqs, out.block_ids, out.num_computed_before, out.num_new_tokens):
            self.compute(req, ids, c, q, live=True)
            held = kvm.num_real_blocks(req.request_id)
            assert held <= kvm.max_blocks_held(req.num_prompt_tokens + req.max_tokens)
        toks = [self.rng.randrange(6) for _ in out.reqs] if self.ids else None
        return StepResult(0.01 + 0.001 * out.shape.num_tokens, toks)

    def compute(self, req: Request, ids: list[int], c: int, q: int, live: bool) -> None:
        """Write the KV of positions c .. c+q-1 into `ids` and check every key they read
        (`live`: the request still holds its blocks, so they must be referenced)."""
        bs, kvm = self.bs, self.sched.kv_cache_manager
        for p in range(c, c + q):  # write the new tokens' KV
            self.device[ids[p // bs] * bs + p % bs] = self.content(req, p)
        first = max(0, c - self.window + 1) if self.window else 0
        for p in range(first, c + q):  # every key some new token attends to
            b = ids[p // bs]
            assert b != NULL_BLOCK_ID, (req.request_id, p, c, q, ids)
            assert not live or kvm.block_pool.blocks[b].ref_cnt >= 1, (req.request_id, p, b)
            assert self.device.get(b * bs + p % bs) == self.content(req, p), (
                f"{req.request_id} reads position {p} from block {b}: not its KV")

    def content(self, req: Request, p: int):
        """What the KV at position `p` of `req` is: its token prefix; without sampled token
        ids (simulator mode) the prompt prefix, or the request and position past it."""
        if self.ids or p < req.num_prompt_tokens:
            return hash(tuple(req.token_ids_slice(0, p + 1)))
        return req.request_id, p

    def burst(self, out: SchedulerOutput, k: int, tables: list[list[int]]) -> None:
        """Steps 2..k of a decode burst, after `update` allocated their blocks (`tables`: the
        block tables the burst ran with), step by step."""
        for j in range(1, k):
            for req, ids, c in zip(out.reqs, tables, out.num_computed_before):
                self.compute(req, ids, c + j, 1, live=False)


def run(sched: Scheduler, reqs: list[Request], backend, max_burst: int = 1) -> None:
    pending = list(reqs)
    now = 0.0
    for _ in range(20000):
        while pending and pending[0].arrival_time <= now:
            sched.add_request(pending.pop(0), now)
        if not sched.has_unfinished_requests():
            if not pending:
                return
            now = pending[0].arrival_time
            continue
        out = sched.schedule(now)
        result = backend.execute(out)
        k = sched.max_decode_burst(out, max_burst) if max_burst > 1 else 1
        if k > 1 and pending:
            ends = list(accumulate([result.duration_s] * k, initial=now))[1:]
            k = next((j + 1 for j, e in enumerate(ends) if e >= pending[0].arrival_time), k)
        if k > 1:
            ends = list(accumulate([result.duration_s] * k, initial=now))[1:]
            result = StepResult(ends[-1] - now, None, ends)
        end = ends[-1] if k > 1 else now + result.duration_s
        kvm = sched.kv_cache_manager
        snap: dict[str, list[int]] = {}
        if k > 1:  # the burst's tables: after its allocations, before the frees at its end
            def free_blocks_before(rid, first, _free=kvm.free_blocks_before, _kvm=kvm, _snap=snap):
                _snap.setdefault(rid, list(_kvm.get_block_ids(rid)))
                _free(rid, first)
            kvm.free_blocks_before = free_blocks_before
        sched.update(out, result, end)
        if k > 1:
            del kvm.free_blocks_before
            backend.burst(out, k, [snap.get(r.request_id, ids) for r, ids in zip(out.reqs, out.block_ids)])
        now = end
    raise AssertionError("did not finish")


def assert_whole(sched: Scheduler, reqs: list[Request]) -> None:
    kvm = sched.kv_cache_manager
    assert kvm.num_free_blocks == kvm.num_gpu_blocks
    assert len(kvm.free_cpu_blocks) == kvm.num_cpu_blocks
    assert not kvm.req_to_blocks and not kvm.num_skipped_blocks and not kvm.cpu_skipped_blocks
    assert all(r.status.is_finished for r in reqs)
    assert not sched.running and not sched.waiting and not sched.requests


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000))
# a request scheduled for its prompt's rest, then preempted in the same pass (a higher-priority
# request's forks needed blocks), kept those blocks' hashes registered though their KV was never
# computed; re-admitted, it hit them (KVCacheManager.free now forgets them)
@example(k={"block_size": 2, "window": 6, "num_gpu_blocks": 20, "num_cpu_blocks": 0,
            "budget_blocks": 2, "max_num_seqs": 3, "chunked": True, "threshold": 0,
            "swap": False, "policy": "priority", "caching": True,
            "capacity": "max_utilization", "mixed": True, "whole_prompt": False},
         wl=[(1, 1, 0, 0.0, 1), (1, 1, 0, 0.0, 1), (22, 1, 0, 0.0, 1), (53, 1, 0, 0.125, 3),
             (19, 1, 0, 0.0, 1)],
         seed=0)
def test_no_block_a_later_step_reads_is_freed_and_the_pool_is_whole(k, wl, seed):
    sched, reqs = build(k, wl, seed)
    run(sched, reqs, ShadowBackend(sched, seed))
    assert_whole(sched, reqs)
    for r in reqs:
        if r.status != RequestStatus.FINISHED_REJECTED:
            assert 1 <= r.num_output_tokens <= r.max_tokens


@pytest.mark.skipif(native.active(), reason="wraps a KVCacheManager method on the instance, "
                    "which the compiled core (KVPD_NATIVE=1) does not allow")
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knobs, workload, st.integers(0, 1000))
# a preempted request waits with its cached prefix in the free queue; a burst's decodes evict
# part of it, which lets it in a step earlier than the burst assumed (decode_burst.py)
@example(k={"block_size": 2, "window": 12, "num_gpu_blocks": 22, "num_cpu_blocks": 0,
            "budget_blocks": 1, "max_num_seqs": 4, "chunked": True, "threshold": 0,
            "swap": False, "policy": "priority", "caching": True,
            "capacity": "max_utilization", "mixed": True},
         wl=[(1, 1, 0, 0.0, 1)] * 4 + [(1, 15, 0, 0.0, 1), (18, 2, 1, 0.09375, 1),
                                       (9, 1, 0, 0.0, 1), (1, 12, 0, 0.0, 3)],
         seed=0)
def test_decode_bursts_equal_steps_with_a_window(k, wl, seed):
    s1, r1 = build(k, wl, seed)
    run(s1, r1, ShadowBackend(s1, seed, ids=False))
    s2, r2 = build(k, wl, seed)
    run(s2, r2, ShadowBackend(s2, seed, ids=False), max_burst=64)
    for a, b in zip(r1, r2):
        assert (a.status, a.num_output_tokens, a.num_preemptions) == (
            b.status, b.num_output_tokens, b.num_preemptions)
        assert list(a.token_times) == list(b.token_times)
    assert_whole(s2, r2)


def test_freed_blocks_make_a_long_request_fit_a_small_pool():
    """12 blocks of 4 tokens (48 tokens) cannot hold a 100 + 20 token request whole; with an
    8-token window it holds at most 8 blocks at once, and finishes."""
    def serve(window: bool):
        k = dict(block_size=4, window=8, num_gpu_blocks=12, num_cpu_blocks=0, budget_blocks=2,
                 max_num_seqs=4, chunked=True, threshold=0, swap=False, policy="fcfs",
                 caching=True, capacity="max_utilization")
        sched, reqs = build(k, [(100, 20, 0, 0.0, 1)], 0, window)
        run(sched, reqs, ShadowBackend(sched, 0, ids=False))
        return sched, reqs[0]

    sched, req = serve(window=False)
    assert req.status == RequestStatus.FINISHED_REJECTED and "whole pool has 12" in req.stop_reason
    sched, req = serve(window=True)
    assert req.status == RequestStatus.FINISHED_LENGTH and req.num_output_tokens == 20
    assert sched.kv_cache_manager.num_slid_out_blocks >= 120 // 4 - 8
    assert_whole(sched, [req])


def test_window_admits_more_requests_at_once():
    """Long prompts in a pool that holds two of them whole: with the window, blocks that slid
    out are free for the next admissions, so more requests run together (and none is
    preempted)."""
    def peak_running(window: bool) -> tuple[int, int]:
        k = dict(block_size=4, window=16, num_gpu_blocks=64, num_cpu_blocks=0, budget_blocks=4,
                 max_num_seqs=8, chunked=True, threshold=0, swap=False, policy="fcfs",
                 caching=False, capacity="max_utilization")
        sched, reqs = build(k, [(80, 16, i, 0.0, 1) for i in range(4)] * 2, 1, window)
        peak = 0
        backend = ShadowBackend(sched, 1, ids=False)
        orig = backend.execute

        def execute(out):
            nonlocal peak
            peak = max(peak, len(sched.running))
            return orig(out)

        backend.execute = execute
        run(sched, reqs, backend)
        assert_whole(sched, reqs)
        return peak, sched.num_preemptions

    full, window = peak_running(False), peak_running(True)
    assert window[0] > full[0]
    assert window[1] == 0 < full[1] or window[1] < full[1] or full[1] == 0


def test_window_prefix_hit_needs_only_the_blocks_in_the_window():
    """A cached prefix whose early blocks were evicted still hits: the blocks the first
    recomputed token reads are cached; the rest come back as NULL (id -1) and are not held."""
    cache = CacheConfig(num_gpu_blocks=64, block_size=4, sliding_window=6,
                        free_outside_window=True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=96), cache)
    kvm = sched.kv_cache_manager
    prompt = list(range(40))
    a = Request("a", prompt_token_ids=prompt, sampling_params=SamplingParams(max_tokens=1))
    backend = ShadowBackend(sched, 0)
    run(sched, [a], backend)
    for b in list(kvm.block_pool.cached_hash_to_block.values())[:3]:  # evict the first blocks
        kvm.block_pool._evict(b)
    req = Request("b", prompt_token_ids=prompt + [99], sampling_params=SamplingParams(max_tokens=1))
    hits, num_hit = kvm.get_computed_blocks(req)
    assert num_hit == 40  # 10 blocks; 6 - 1 keys before position 40 live in blocks 8, 9
    assert [b.block_id for b in hits[:8]] == [NULL_BLOCK_ID] * 8
    assert all(b.block_id >= 0 for b in hits[8:])
    run(sched, [req], backend)
    assert_whole(sched, [req])
    assert kvm.prefix_hit_tokens >= 40


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_pd_roles_keep_every_block(role):
    cache = CacheConfig(num_gpu_blocks=64, block_size=4, sliding_window=6, free_outside_window=True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, role=role), cache)
    assert sched.kv_cache_manager.sliding_window == 0
    assert sched.kv_cache_manager.max_blocks_held(100) == 25


def test_mixed_layers_keep_every_block_but_shapes_carry_the_window():
    cache = CacheConfig(num_gpu_blocks=64, block_size=4, sliding_window=6, free_outside_window=False)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), cache)
    req = Request("a", prompt_token_ids=list(range(30)), sampling_params=SamplingParams(max_tokens=3))
    sched.add_request(req, 0.0)
    out = sched.schedule(0.0)
    assert out.shape.window == 6 and out.shape.prefill_window_context_tokens == 30
    assert out.shape.prefill_window_pairs == sum(min(p + 1, 6) for p in range(30))
    backend = ShadowBackend(sched, 0)
    sched.update(out, backend.execute(out), 0.01)
    run(sched, [], backend)  # finish the one in flight
    assert req.status.is_finished
    assert sched.kv_cache_manager.num_slid_out_blocks == 0


def test_a_swapped_out_request_with_a_long_slid_chunk_is_swapped_back_in():
    """Hypothesis found it: a 14-token prompt chunk with a 2-token window, swapped out right
    after, used to copy all 14 blocks to the host; resuming then needed 20 blocks of a
    19-block pool and the request waited for ever. Slid-out blocks are freed at swap-out."""
    k = {"block_size": 1, "window": 2, "num_gpu_blocks": 19, "num_cpu_blocks": 14,
         "budget_blocks": 2, "max_num_seqs": 4, "chunked": True, "threshold": 0, "swap": True,
         "policy": "fcfs", "caching": False, "capacity": "max_utilization"}
    wl = [(1, 2, 0, 0.0, 1), (1, 2, 0, 0.0, 2), (20, 1, 0, 0.0, 1)]
    for max_burst in (1, 64):
        sched, reqs = build(k, wl, 0)
        run(sched, reqs, ShadowBackend(sched, 0, ids=False), max_burst=max_burst)
        assert_whole(sched, reqs)
        assert reqs[2].num_preemptions == 1 and reqs[2].num_output_tokens == 1
