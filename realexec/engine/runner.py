"""`ModelRunner`: the real executor of the core's `SchedulerOutput`s (the core's `Executor`).

Per step, in the order `SchedulerOutput` prescribes: device block copies (copy-on-write
after an n > 1 fork), swap-out copies to the host pool, swap-in copies back, then one
forward pass over the flat batch of all scheduled tokens, then one sampled token per
request whose computed range reaches its `num_tokens`; for requests that ask for prompt
logprobs, the log-probabilities of the prompt tokens their chunk predicts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from realexec.engine.attention import GatherWorkspace, PagedAttention, build_metadata
from realexec.engine.device import synchronize
from realexec.engine.kv_cache import PagedKVCache
from realexec.engine.kv_groups import KVGroups
from realexec.engine.linear_attention import LinearStates, Segment
from realexec.engine.paged_model import PagedCausalLM
from realexec.engine.sampler import Sampler, row_from_params
from simulator.core.batch_shape import BatchShape
from simulator.core.request import Request
from simulator.core.scheduler_output import SchedulerOutput, StepResult

# prompt positions whose logits are made at once for prompt logprobs (x vocab x 4 bytes)
PROMPT_LOGITS_ROWS = 256


@dataclass(slots=True)
class StepRecord:
    """One executed step, for profiling: its shape and measured times (s)."""

    t_start: float  # wall clock (s, epoch) when execution began
    shape: BatchShape
    execute_s: float  # copies + forward + sampling, synchronized
    duration_s: float  # what was reported to the core (includes scheduling when clocked)
    num_swapped_blocks: int


def uniform_window(windows: list[int | None]) -> int | None:
    """The sliding window (tokens) when every layer has the same one, else None."""
    return windows[0] if windows and windows[0] and all(w == windows[0] for w in windows) else None


def sliding_window_of(windows: list[int | None]) -> int:
    """The window of a model's sliding layers (tokens; 0 if none), for the cost shapes."""
    sliding = [w for w in windows if w]
    return min(sliding) if sliding else 0


class ModelRunner:
    """Runs `SchedulerOutput`s on a `PagedCausalLM` with a `PagedKVCache`.

    `clock` (s) and `step_start` let the engine make `duration_s` cover the whole step
    (scheduling included) so that token timestamps are wall-clock times; without a clock,
    `duration_s` is the execution time alone.
    """

    def __init__(self, model: PagedCausalLM, cache: PagedKVCache, seed: int = 0,
                 clock: Callable[[], float] | None = None, record_steps: bool = False,
                 groups: KVGroups | None = None,
                 window_tables: Callable[[str], list[list[int]]] | None = None) -> None:
        self.model = model
        self.cache = cache
        self.device = model.device
        self.sampler = Sampler(self.device, seed)
        self.generators: dict[str, torch.Generator] = {}
        self.clock = clock
        self.step_start: float | None = None
        self.record_steps = record_steps
        self.steps: list[StepRecord] = []
        self.workspace = GatherWorkspace()
        # every layer slides by one window: gather only its keys (the core frees the rest)
        self.window = uniform_window(model.windows)
        # each running request's linear-attention state (models with such layers)
        self.linear_states = LinearStates(model.config) if model.has_linear else None
        # KV cache groups (a model mixing sliding and full layers, vLLM V1's layout): each
        # sliding group's block tables, by request, from the core (`window_block_ids`)
        if (groups is None) != (window_tables is None):
            raise ValueError("KV cache groups need the core's sliding-group block tables")
        self.groups = groups
        self.window_tables = window_tables

    def drop_request(self, request_id: str) -> None:
        """Forget per-request state (its RNG, its linear-attention state) of a finished
        request."""
        self.generators.pop(request_id, None)
        if self.linear_states is not None:
            self.linear_states.drop(request_id)

    def _generator(self, req: Request) -> torch.Generator | None:
        seed = req.sampling_params.seed
        if seed is None or req.sampling_params.greedy:
            return None
        g = self.generators.get(req.request_id)
        if g is None:
            g = self.generators[req.request_id] = self.sampler.make_generator(seed)
        return g

    def execute(self, output: SchedulerOutput) -> StepResult:
        t_wall = time.time() if self.record_steps else 0.0
        t0 = time.perf_counter()
        for rid in output.finished_req_ids:
            self.drop_request(rid)
        cache = self.cache
        cache.copy_blocks(output.blocks_to_copy)
        cache.swap_out(output.blocks_to_swap_out)
        cache.swap_in(output.blocks_to_swap_in)
        sampled: list[int] | None = None
        if output.reqs:
            sampled = self._forward_and_sample(output)
        synchronize(self.device)
        execute_s = time.perf_counter() - t0
        duration = execute_s
        if self.clock is not None and self.step_start is not None:
            duration = self.clock() - self.step_start
        if self.record_steps:
            n = len(output.blocks_to_swap_in) + len(output.blocks_to_swap_out)
            self.steps.append(StepRecord(t_wall, output.shape, execute_s, duration, n))
        return StepResult(duration_s=duration, sampled_token_ids=sampled)

    @torch.inference_mode()
    def _forward_and_sample(self, output: SchedulerOutput) -> list[int]:
        ids: list[int] = []
        sample_rows: list[int] = []
        logit_idx: list[int] = []
        prompt_rows: list[tuple[Request, int, int, int]] = []  # req, first position, count, at
        states = self.linear_states
        segments: list[Segment] = []  # (models with linear-attention layers)
        offset = 0
        for i, (req, n, before) in enumerate(
            zip(output.reqs, output.num_new_tokens, output.num_computed_before)
        ):
            ids.extend(req.token_ids_slice(before, before + n))
            if states is not None:
                segments.append(Segment(req, offset, n, before))
            if req.sampling_params.prompt_logprobs is not None and before < req.num_prompt_tokens:
                # positions before the prompt's last predict its next token
                scored = min(before + n, req.num_prompt_tokens - 1) - before
                prompt_rows.append((req, before, scored, offset))
            offset += n
            if before + n == req.num_tokens:
                sample_rows.append(i)
                logit_idx.append(offset - 1)
        dev = self.device
        meta = build_metadata(
            output.num_new_tokens, output.num_computed_before, output.block_ids,
            self.cache.block_size, self.cache.num_blocks, dev, self.window,
        )
        group_metas = None
        if self.groups is not None and self.window_tables is not None:
            # each sliding group's tables: only its window's blocks are read (ValueError if
            # the core freed one a step still reads)
            tables = [self.window_tables(req.request_id) for req in output.reqs]
            group_metas = [meta] + [
                build_metadata(output.num_new_tokens, output.num_computed_before,
                               [t[k] for t in tables], self.cache.block_size,
                               self.cache.num_blocks, dev, self.groups.window)
                for k in range(self.groups.sliding_groups)]
        attention = PagedAttention(self.cache, meta, self.workspace, group_metas,
                                   self.groups.layer_map if self.groups else None)
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        linear = None
        if states is not None:
            states.begin_step(segments)
            linear = (states, segments)
        hidden = self.model.forward(input_ids, meta.positions, attention, linear)
        if states is not None:
            states.snapshot_forks(segments)
        for req, first, count, at in prompt_rows:
            self._record_prompt_logprobs(req, hidden, first, count, at)
        sampled = [-1] * len(output.reqs)
        if sample_rows:
            logits = self.model.compute_logits(hidden, torch.tensor(logit_idx, device=dev))
            rows = []
            for i in sample_rows:
                req = output.reqs[i]
                sp = req.sampling_params
                history = ((req.prompt_token_ids or (), req.output_token_ids) if sp.penalized
                           else ((), ()))
                rows.append(row_from_params(sp, req.num_output_tokens, req.eos_token_id,
                                            self._generator(req), *history))
            want = [j for j, i in enumerate(sample_rows)
                    if output.reqs[i].sampling_params.logprobs is not None]
            # before sampling, which masks banned tokens in `logits` in place
            logprobs = logits[want].log_softmax(dim=-1)  # fp32 already if want else None
            for i, tok in zip(sample_rows, self.sampler.sample(logits, rows)):
                sampled[i] = tok
            for k, j in enumerate(want):
                record_logprobs(output.reqs[sample_rows[j]], logprobs[k], sampled[sample_rows[j]])
        return sampled

    def _record_prompt_logprobs(self, req: Request, hidden: torch.Tensor, first: int,
                                count: int, at: int) -> None:
        """Log-probabilities of prompt tokens first+1 .. first+count from the hidden states
        at rows at .. at+count-1, in slices so the logits stay small: (the token's, top ids, top
        log-probabilities, the token's rank: 1 + the tokens more likely than it)."""
        if req.prompt_logprobs is None:
            req.prompt_logprobs = [None] * (req.num_prompt_tokens - 1)
        k = int(req.sampling_params.prompt_logprobs or 0)
        prompt = req.prompt_token_ids or []
        for lo in range(0, count, PROMPT_LOGITS_ROWS):
            rows = torch.arange(at + lo, at + min(count, lo + PROMPT_LOGITS_ROWS),
                                device=hidden.device)
            lps = self.model.compute_logits(hidden, rows).log_softmax(dim=-1)
            targets = torch.tensor(prompt[first + lo + 1:first + lo + 1 + len(rows)],
                                   device=lps.device)
            chosen = lps.gather(-1, targets.unsqueeze(-1))
            ranks = (lps >= chosen).sum(dim=-1).tolist()  # ties rank after, as vLLM's
            top_v, top_i = lps.topk(min(k, lps.shape[-1]), dim=-1)
            for r, entry in enumerate(zip(chosen.squeeze(-1).tolist(), top_i.tolist(),
                                          top_v.tolist(), ranks)):
                req.prompt_logprobs[first + lo + r] = entry


def record_logprobs(req: Request, row: torch.Tensor, token: int) -> None:
    """Append the sampled `token`'s log-probability and the request's top-k ones (`row`:
    `[vocab]` log-softmax of the raw logits) to `req.logprobs`."""
    k = min(int(req.sampling_params.logprobs or 0), row.shape[-1])
    top_v, top_i = row.topk(k) if k else (row[:0], row[:0].long())
    if req.logprobs is None:
        req.logprobs = []
    req.logprobs.append((float(row[token]), top_i.tolist(), top_v.tolist()))
