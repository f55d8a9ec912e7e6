"""vLLM's own V0 `Scheduler` (vLLM before 0.8), run on the CPU with no model: the V0 side of
`bench/diagnostics/vllm_scheduler.py`, which starts this file under an interpreter that can
import a released vLLM (see that file). Not imported by kvpd.

Every request is in the waiting queue at once (a burst). After each step every scheduled
sequence group counts its chunk as computed, and one whose prompt is done samples one token,
as V0's LLMEngine does (without async output processing); a sequence stops at max_tokens.
Prints one JSON line: {"trace": [[scheduled tokens, scheduled groups, preemptions so far],
...]} for every step that scheduled tokens.

With {"time": [N, ...]} it times instead, while N requests decode side by side, `schedule()`
(which also builds each group's `SequenceGroupMetadata`) and the token append that
`LLMEngine._advance_to_next_step` runs before the next step when output processing is async
(V0's default on CUDA and ROCm), with `free_finished_seq_groups()` (`time_decode`, for
`vllm_host_cost.py`), and prints {"timing": [[N, schedule s, append s], ...]} (medians per step).
"""

from __future__ import annotations

import json
import sys

from step_timing import median_phase_times
from vllm.config import CacheConfig, SchedulerConfig
from vllm.core.scheduler import Scheduler
from vllm.inputs import token_inputs
from vllm.sampling_params import SamplingParams
from vllm.sequence import Logprob, Sequence, SequenceGroup, SequenceStatus


def prompt_ids(i: int, n: int) -> list[int]:
    """Request i's prompt (the kvpd side's `prompt_ids`): distinct per request."""
    return [(i * 7919 + j * 104729) % 150000 + 1 for j in range(n)]


def make_scheduler(num_blocks: int, budget: int, seqs: int, chunked: bool = True,
                   prefix: bool = False, block: int = 16, max_len: int = 40960) -> Scheduler:
    sched_cfg = SchedulerConfig(runner_type="generate", max_num_batched_tokens=budget,
                                max_num_seqs=seqs, max_model_len=max_len,
                                enable_chunked_prefill=chunked)
    cache_cfg = CacheConfig(block_size=block, gpu_memory_utilization=0.9, swap_space=0,
                            cache_dtype="auto", enable_prefix_caching=prefix)
    cache_cfg.num_gpu_blocks, cache_cfg.num_cpu_blocks = num_blocks, 0
    return Scheduler(sched_cfg, cache_cfg, None)


def add_requests(sched: Scheduler, n: int, prompt: int, out: int, block: int = 16) -> None:
    for i in range(n):
        seq = Sequence(i, token_inputs(prompt_ids(i, prompt)), block)
        sched.add_seq_group(SequenceGroup(str(i), [seq], arrival_time=0.0,
                                          sampling_params=SamplingParams(max_tokens=out,
                                                                         ignore_eos=True)))


def advance(sched: Scheduler, metas: list, outputs, out: int) -> None:
    """What the engine does with a step's samples before the next one (every group samples
    token id 1), and the scheduler's release of finished groups."""
    for meta, scheduled in zip(metas, outputs.scheduled_seq_groups):
        group = scheduled.seq_group
        group.update_num_computed_tokens(meta.token_chunk_size)
        if meta.do_sample:
            seq = group.first_seq
            seq.append_token_id(1, {1: Logprob(0.0)})
            if seq.get_output_len() >= out:
                seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
    sched.free_finished_seq_groups()


def time_decode(n: int, steps: int = 60, warm: int = 20) -> tuple[float, float]:
    """Median seconds of `schedule()` and of the append (`advance`) per step while `n`
    requests decode side by side (8-token prompts, room for all), after `warm` steps."""
    out = steps + warm + 8
    sched = make_scheduler(num_blocks=max(4096, 4 * n * (out + 40) // 16),
                           budget=max(8192, 8 * n), seqs=n, chunked=False, max_len=8192)
    add_requests(sched, n, 8, out)

    def append(scheduled: tuple) -> int:
        metas, outputs, _ = scheduled
        advance(sched, metas, outputs, out)
        return len(metas)

    return median_phase_times(sched.schedule, lambda s: s, append, n, steps, warm)


def run(num_blocks: int, n: int, prompt: int, out: int, budget: int, seqs: int,
        chunked: bool = True, prefix: bool = False, block: int = 16,
        max_len: int = 40960) -> list[list[int]]:
    sched = make_scheduler(num_blocks, budget, seqs, chunked, prefix, block, max_len)
    add_requests(sched, n, prompt, out, block)
    trace = []
    while sched.has_unfinished_seqs():
        metas, outputs, _ = sched.schedule()
        tokens = sum(m.token_chunk_size for m in metas)
        if tokens:
            trace.append([tokens, len(metas), sched.num_cumulative_preemption])
        advance(sched, metas, outputs, out)
    return trace


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    if "time" in args:  # {"time": [n, ...]}: `time_decode` at each n (vllm_host_cost.py)
        print(json.dumps({"timing": [[n, *time_decode(n)] for n in args["time"]]}))
    else:
        print(json.dumps({"trace": run(**args)}))
