"""`LLM`: vLLM-style offline API over the shared core (scheduler, KV manager, engine step)
driving the real `ModelRunner`, plus the step-level API the serving layer uses.

Times are seconds on the engine clock: `time.perf_counter()` since the `LLM` was created.
"""

from __future__ import annotations

import math
import numbers
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from realexec.engine.kv_cache import KVCacheSpec, PagedKVCache, num_blocks_from_budget
from realexec.engine.kv_groups import KVGroups, kv_groups
from realexec.engine.linear_attention import LinearStates, Segment, state_blocks
from realexec.engine.model_loader import LoadedModel, ModelSpec, eos_token_id, load_model
from realexec.engine.outputs import CompletionOutput, RequestOutput
from realexec.engine.paged_model import PagedCausalLM
from realexec.engine.runner import ModelRunner, sliding_window_of, uniform_window
from realexec.engine.simple_attention import NoCacheAttention
from realexec.engine.tokenizer import (
    Detokenizer,
    chat_token_ids,
    has_tokenizer,
    load_tokenizer,
)
from simulator.core.config import CacheConfig, SchedulerConfig, check_min
from simulator.core.engine import EngineCore, EngineStepOutput
from simulator.core.request import Request, RequestStatus, SamplingParams
from simulator.core.scheduler import Scheduler

# vLLM v1's default token budget for online serving on GPUs (EngineArgs: 2048 when chunked
# prefill is on); a step of 2048 tokens of the default model is ~0.6 s on 2 CPU cores.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
# vLLM's default cap on concurrently running sequences.
DEFAULT_MAX_NUM_SEQS = 256

SamplingArg = SamplingParams | dict[str, Any] | None


def _listed(x: Any) -> Any:
    """A torch tensor or numpy array as nested lists; anything else as it is."""
    return x.tolist() if isinstance(x, torch.Tensor | np.ndarray) else x


def unwrap_prompt(index: int, prompt: Any) -> Any:
    """vLLM's prompt mappings as what they hold: `{"prompt": text}` (TextPrompt) as the text,
    `{"prompt_token_ids": ids}` (TokensPrompt) as the ids; anything else as it is. ValueError
    naming the request for a mapping with other keys."""
    if not isinstance(prompt, Mapping):
        return prompt
    keys = sorted(map(str, prompt))
    if keys == ["prompt"] and isinstance(prompt["prompt"], str):
        return prompt["prompt"]
    if keys == ["prompt_token_ids"]:
        return prompt["prompt_token_ids"]
    raise ValueError(f"request {index}: a prompt mapping holds 'prompt' (a text: vLLM's "
                     "TextPrompt) or 'prompt_token_ids' (vLLM's TokensPrompt), one of them; "
                     f"got keys {keys}")


def validate_prompt(index: int, prompt: Any, vocab_size: int) -> list[int]:
    """The prompt as a list of ints; ValueError naming the request index and field."""
    prompt = _listed(prompt)
    if not isinstance(prompt, Sequence) or isinstance(prompt, str | bytes):
        raise ValueError(
            f"request {index}: prompt_token_ids must be a list of token ids, got {type(prompt).__name__}"
        )
    if len(prompt) == 0:
        raise ValueError(f"request {index}: prompt_token_ids is empty (need at least 1 token)")
    out = []
    for j, t in enumerate(prompt):
        if isinstance(t, bool) or not isinstance(t, int):
            try:
                ok = int(t) == t
            except (TypeError, ValueError):
                ok = False
            if not ok or isinstance(t, bool):
                raise ValueError(
                    f"request {index}: prompt_token_ids[{j}] = {t!r} is not an integer token id"
                )
        t = int(t)
        if not 0 <= t < vocab_size:
            raise ValueError(
                f"request {index}: prompt_token_ids[{j}] = {t} is outside the vocabulary "
                f"[0, {vocab_size})"
            )
        out.append(t)
    return out


def validate_sampling(index: int, params: SamplingArg) -> SamplingParams:
    """SamplingParams from an object, a dict of options or None; errors name the request."""
    where = f"request {index}: sampling_params"
    if params is None:
        return SamplingParams()
    if isinstance(params, dict):
        return SamplingParams.from_dict(params, where)
    if isinstance(params, SamplingParams):
        params.validate(where)
        return params
    raise ValueError(f"{where} must be a SamplingParams or a dict, got {type(params).__name__}")


class LLM:
    """A real model served by the shared core with a paged KV cache.

    `model`: a model directory (config.json + safetensors), a config.json path, a config dict or
    `PretrainedConfig` (seeded random weights), a built-in name (`realexec.engine.configs`), or an
    already `LoadedModel` (then `dtype`, `device` and the weight options are its own).
    The KV pool has `num_gpu_blocks` blocks, or as many as fit in `gpu_memory_utilization` of
    the device's memory (capped at 4 GiB on CPU, and at what `max_num_seqs` sequences of
    `max_model_len` tokens can use). `num_cpu_blocks` is the host pool for
    swap preemption (defaults to the device pool's size when `preemption_mode="swap"`).
    `seed` drives sampling of requests without their own seed (as vLLM's); `model_seed` the
    random weights of a model given by its config alone. `role`: "colocated", or "prefill" /
    "decode" for a PD worker's scheduler. `capacity_policy`: "max_utilization" (admit while
    blocks are free, preempt when they run out), "guaranteed_no_evict" (reserve each
    request's whole length at admission, never preempt) or "reserve_ratio" (SGLang's decaying
    reservation of the running outputs; `simulator.core.capacity`).
    `mixed_batches` False: prompts run in steps of their own, first, while decodes wait
    (SGLang's default; `SchedulerConfig`). `first_token_from_decode`: the prompt's last token
    runs in the next step, as a decode that samples the first token (LMDeploy TurboMind
    before v0.1.0a2; `SchedulerConfig`).
    `tokenizer`: a directory with tokenizer files (default: the model directory, if it has
    them); with one, prompts may be text and outputs carry their `text`, as vLLM's `LLM`.
    Sliding windows: when every layer slides by one window (Mistral-7B-v0.1), blocks that slid
    out of it are freed and the executor gathers only the window's keys; prefix caching still
    works (a hit needs only the window's blocks before it). Models mixing full and sliding
    layers (Qwen2 `layer_types`, gpt-oss) keep every block: the full layers read them all;
    with `hybrid_kv_cache` their sliding layers get block tables of their own instead, which
    hold only the window, as vLLM V1's hybrid KV cache manager does
    (`realexec.engine.kv_groups`); a prefix hit then revives the window's cached blocks.
    Linear attention (Qwen3-Next's Gated DeltaNet layers, Nemotron-H's Mamba-2 blocks): each
    request's state is held in blocks of the pool from its first step to its end
    (`CacheConfig.state_blocks`), prefix caching is off for such a model (the state at a
    prefix's end is not kept; vLLM V1 turns it off for them too) and swap preemption is
    refused.
    """

    def __init__(
        self,
        model: ModelSpec | Path | LoadedModel = "llama-50m",
        dtype: str | torch.dtype = "fp32",
        device: str | torch.device | None = None,
        block_size: int = 16,
        num_gpu_blocks: int | None = None,
        gpu_memory_utilization: float = 0.9,
        num_cpu_blocks: int | None = None,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        enable_chunked_prefill: bool = True,
        long_prefill_token_threshold: int = 0,
        enable_prefix_caching: bool = True,
        preemption_mode: str = "recompute",
        policy: str = "fcfs",
        batching: str = "continuous",
        max_model_len: int | None = None,
        seed: int = 0,
        model_seed: int = 0,
        initializer_range: float | None = None,
        record_steps: bool = False,
        role: str = "colocated",
        capacity_policy: str = "max_utilization",
        mixed_batches: bool = True,
        first_token_from_decode: bool = False,
        prompt_allocation: str = "per_chunk",
        admission_watermark: float = 0.0,
        append_needs_free_block: bool = False,
        recv_interval: int = 1,
        batch_wait_timeout_iters: int = 0,
        batch_wait_max_tokens_ratio: float = 0.0,
        tokenizer: str | Path | None = None,
        hybrid_kv_cache: bool = False,
    ) -> None:
        check_min("cache.block_size", block_size, 1)  # sizes the pool before CacheConfig
        if tokenizer is not None and not has_tokenizer(tokenizer):
            raise ValueError(f"tokenizer {tokenizer}: not a directory with tokenizer.json / "
                             "tokenizer_config.json")
        if isinstance(model, LoadedModel):  # share one loaded model between engines
            self.loaded = model
        else:
            self.loaded = load_model(model, dtype, device, model_seed, initializer_range)
        self.device = self.loaded.device
        self.model = PagedCausalLM(self.loaded.model)
        self.vocab_size = int(self.loaded.config.vocab_size)
        self.eos_token_id = eos_token_id(self.loaded.config)
        model_max = self.loaded.max_model_len
        if max_model_len is None:
            max_model_len = model_max
        elif max_model_len > model_max:
            raise ValueError(
                f"max_model_len {max_model_len} exceeds the model's context ({model_max} tokens)"
            )
        sched_cfg = SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
            preemption_mode=preemption_mode,
            policy=policy,
            batching=batching,
            role=role,
            capacity_policy=capacity_policy,
            mixed_batches=mixed_batches,
            first_token_from_decode=first_token_from_decode,
            prompt_allocation=prompt_allocation,
            admission_watermark=admission_watermark,
            append_needs_free_block=append_needs_free_block,
            recv_interval=recv_interval,
            batch_wait_timeout_iters=batch_wait_timeout_iters,
            batch_wait_max_tokens_ratio=batch_wait_max_tokens_ratio,
        )
        planes, kv_heads, kv_dim = self.model.kv_cache_shape
        groups = self._kv_groups(hybrid_kv_cache, preemption_mode, role)
        spec = KVCacheSpec(groups.group_layers if groups else self.model.num_kv_layers,
                           kv_heads, kv_dim, block_size, self.loaded.dtype, num_planes=planes)
        if num_gpu_blocks is None:
            used = self.loaded.weight_bytes + self._profile_activation_bytes(
                min(max_num_batched_tokens, max_model_len))
            num_gpu_blocks = num_blocks_from_budget(spec, self.device, gpu_memory_utilization, used)
            # more blocks than max_num_seqs full-length sequences can use only hold stale
            # prefixes, and the core's BlockPool costs ~4 us of setup per block (with KV cache
            # groups a sequence's sliding groups hold at most as many blocks as its table)
            tables = 1 + (groups.sliding_groups if groups else 0)
            num_gpu_blocks = min(num_gpu_blocks,
                                 max_num_seqs * tables * -(-max_model_len // block_size))
        if num_cpu_blocks is None:
            num_cpu_blocks = num_gpu_blocks if preemption_mode == "swap" else 0
        windows = self.model.windows
        # linear-attention layers: each request's state, as KV blocks of the pool (the core
        # holds them, as vLLM V1 does); its prefixes are not cached and it is not swapped
        state = state_blocks(self.model, spec)
        if state and preemption_mode == "swap":
            raise ValueError("preemption_mode 'swap' does not move a request's linear-attention "
                             "state; use 'recompute'")
        if state and role != "colocated":
            raise ValueError(f"role {role!r}: PD hand-off sends KV blocks, not a request's "
                             "linear-attention state; run this model colocated")
        cache_cfg = CacheConfig(
            num_gpu_blocks=num_gpu_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
            enable_prefix_caching=enable_prefix_caching and not state,
            block_bytes=spec.bytes_per_block, state_blocks=state,
            # blocks slide out (are freed) only when every layer slides by one window, or
            # from the sliding layers' own tables with KV cache groups
            sliding_window=sliding_window_of(windows),
            free_outside_window=uniform_window(windows) is not None,
            sliding_groups=groups.sliding_groups if groups else 0,
        )
        self.scheduler = Scheduler(sched_cfg, cache_cfg)
        self.kv_cache = PagedKVCache(spec, num_gpu_blocks, self.device, num_cpu_blocks)
        self._t0 = time.perf_counter()
        kvm = self.scheduler.kv_cache_manager
        self.runner = ModelRunner(self.model, self.kv_cache, seed, clock=self.clock,
                                  record_steps=record_steps, groups=groups,
                                  window_tables=kvm.window_block_ids if groups else None)
        self.engine = EngineCore(self.scheduler, self.runner)
        model_dir = model if isinstance(model, str | Path) and Path(model).is_dir() else None
        self.tokenizer = load_tokenizer(tokenizer if tokenizer is not None else model_dir)
        self._detokenizers: dict[str, Detokenizer] = {}  # requests with stop strings
        self._next_id = 0
        self.finished: dict[str, Request] = {}  # every finished request, by id

    # ------------------------------------------------------------------ setup
    def _kv_groups(self, hybrid: bool, preemption_mode: str, role: str) -> KVGroups | None:
        """vLLM V1's KV cache groups for this model when `hybrid` is asked (None otherwise);
        ValueError for a model without both layer kinds to group, and with what the groups
        do not serve (swap, a PD role)."""
        if not hybrid:
            return None
        groups = None if self.model.has_linear else kv_groups(self.model.windows)
        name = self.loaded.config.model_type
        if groups is None:
            raise ValueError(f"hybrid_kv_cache: {name}'s layers do not split into a "
                             "full-attention group and sliding-window groups (it needs "
                             "sliding-window and full-attention layers, at least as many "
                             "sliding, one window, no linear attention)")
        for on, what in ((preemption_mode == "swap", "preemption_mode='recompute'"),
                         (role != "colocated", "role='colocated' (vLLM turns its hybrid KV "
                          "cache manager off with a KV connector)")):
            if on:
                raise ValueError(f"hybrid_kv_cache: {name} with KV cache groups needs {what}")
        return groups

    def _profile_activation_bytes(self, num_tokens: int) -> int:
        """Peak activation bytes of a `num_tokens` forward (measured on CUDA; 0 elsewhere,
        where the CPU KV cap leaves ample room)."""
        if self.device.type != "cuda":
            return 0
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        pos = torch.arange(num_tokens, device=self.device)
        linear = None
        if self.model.has_linear:  # one request's fresh linear-attention state
            states = LinearStates(self.model.config)
            segments = [Segment(Request("profile", num_prompt_tokens=num_tokens), 0,
                                num_tokens, 0)]
            states.begin_step(segments)
            linear = (states, segments)
        hidden = self.model.forward(ids, pos, NoCacheAttention(), linear)
        self.model.compute_logits(hidden, pos[-1:])
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del hidden
        torch.cuda.empty_cache()
        return int(peak)

    def clock(self) -> float:
        """Seconds since this engine was created."""
        return time.perf_counter() - self._t0

    @property
    def kv_cache_manager(self):
        return self.scheduler.kv_cache_manager

    @property
    def max_model_len(self) -> int:
        return self.scheduler.config.max_model_len

    # ------------------------------------------------------- step-level API
    def make_request(self, request_id: str, prompt_token_ids: Sequence[int] | str,
                     sampling_params: SamplingArg = None, arrival_time: float | None = None,
                     priority: int = 0, index: int = 0) -> Request:
        """A validated core `Request` (ValueError naming `index` and the field if bad); a
        text prompt is encoded by the tokenizer (with its special tokens, as vLLM's `LLM`);
        vLLM's prompt mappings are taken too (`unwrap_prompt`)."""
        prompt_token_ids = unwrap_prompt(index, prompt_token_ids)
        if isinstance(prompt_token_ids, str):
            prompt_token_ids = self._encode(index, prompt_token_ids)
        prompt = validate_prompt(index, prompt_token_ids, self.vocab_size)
        sp = validate_sampling(index, sampling_params)
        if sp.stop and self.tokenizer is None:
            raise ValueError(f"request {index}: sampling_params.stop strings need a tokenizer; "
                             "use stop_token_ids")
        for token, _ in sp.logit_bias:
            if token >= self.vocab_size:
                raise ValueError(f"request {index}: sampling_params.logit_bias: {token} is "
                                 f"outside the vocabulary [0, {self.vocab_size})")
        return Request(
            request_id=str(request_id), prompt_token_ids=prompt, sampling_params=sp,
            arrival_time=self.clock() if arrival_time is None else float(arrival_time),
            eos_token_id=self.eos_token_id, priority=priority,
        )

    def _encode(self, index: int, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(f"request {index}: a text prompt needs a tokenizer: load the model "
                             "from a directory with tokenizer files or pass LLM(..., "
                             "tokenizer=DIR); or give token ids")
        return list(self.tokenizer.encode(text))

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int] | str,
                    sampling_params: SamplingArg = None, arrival_time: float | None = None,
                    priority: int = 0) -> Request:
        """Queue a request now; returns the core `Request` whose fields fill as it runs. A
        request the engine can never serve (too long) comes back finished as "rejected"."""
        req = self.make_request(request_id, prompt_token_ids, sampling_params, arrival_time,
                                priority)
        self.engine.add_request(req, self.clock())
        return req

    def abort_request(self, request_id: str, reason: str = "aborted") -> bool:
        """Finish a queued or running request as aborted; False if it is unknown."""
        return self.engine.abort_request(str(request_id), self.clock(), reason)

    def step(self) -> EngineStepOutput:
        """Run one engine step now; `.finished` lists requests that finished in it.

        A step that raises (an executor error, Ctrl-C) may have left the KV of its requests
        part-written, swaps and copies undone and prefix-cache blocks registered unwritten:
        every request in flight is then finished as aborted (in `finished`, its
        `stop_reason` naming the error), its blocks freed and the prefix cache dropped,
        before the exception propagates; the engine serves what is added next."""
        now = self.clock()
        self.runner.step_start = now
        try:
            out = self.engine.step(now)
        except BaseException as exc:
            self._abort_in_flight(f"a step failed: {type(exc).__name__}: {exc}")
            raise
        finished = out.finished
        if self._detokenizers or any(r.sampling_params.stop for r in out.scheduler_output.reqs):
            finished = finished + self._stop_strings(out)
            out.finished = finished
        for req in finished:
            self.runner.drop_request(req.request_id)
            self.finished[req.request_id] = req
            self._detokenizers.pop(req.request_id, None)
        return out

    def _stop_strings(self, out: EngineStepOutput) -> list[Request]:
        """Requests of this step whose new text holds a stop string, finished as stopped
        with the string as their `stop_reason` and the text before it kept in
        `annotations["text"]`. As vLLM: text made before `min_tokens` is not searched, and
        a string found in a step that also reached `max_tokens` wins."""
        stopped = []
        for req in out.scheduler_output.reqs:
            sp = req.sampling_params
            if (not sp.stop or req.num_output_tokens < max(sp.min_tokens, 1)
                    or req.is_finished and req.finish_reason != "length"):
                continue
            det = self._detokenizers.get(req.request_id)
            if det is None:  # from here on: the text so far is not searched
                det = self._detokenizers[req.request_id] = Detokenizer(
                    self.tokenizer, list(sp.stop), seen=req.output_token_ids[:-1])
            det.add(req.output_token_ids[len(det.ids):])
            if not det.stopped:
                continue
            req.annotations["text"] = det.text
            if req.is_finished:
                req.finish(RequestStatus.FINISHED_STOPPED, req.finish_time or self.clock(),
                           det.matched)
            elif self.engine.scheduler.finish_request(
                    req.request_id, self.clock(), RequestStatus.FINISHED_STOPPED, det.matched,
                    report=False):
                stopped.append(req)
        return stopped

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    # ---------------------------------------------------------- offline API
    def generate(
        self,
        prompts: Sequence[Sequence[int] | str] | str,
        sampling_params: SamplingArg | Sequence[SamplingArg] = None,
        arrival_times: Sequence[float] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs in prompt order.

        `prompts`: token-id lists (or tensors / arrays), or with a tokenizer text (one string
        or a list); with a tokenizer every output also has its `text`. vLLM's prompt mappings,
        `{"prompt": text}` and `{"prompt_token_ids": ids}`, are taken as what they hold.

        `sampling_params`: one for all prompts or one per prompt (SamplingParams or a dict of
        options). `arrival_times`: optional offsets (s) from the call at which each request
        arrives (staggered traffic); by default all arrive at once. All inputs are validated
        before anything runs.
        """
        prompt_token_ids = [prompts] if isinstance(prompts, str | Mapping) else _listed(prompts)
        if isinstance(prompt_token_ids, Sequence) and not isinstance(prompt_token_ids, str):
            prompt_token_ids = [unwrap_prompt(i, p) for i, p in enumerate(prompt_token_ids)]
        if not isinstance(prompt_token_ids, Sequence) or (
            prompt_token_ids
            and not isinstance(prompt_token_ids[0], Sequence | torch.Tensor | np.ndarray)
        ):
            raise ValueError("prompts must be a list of prompts, each a list of token ids, a "
                             "text or vLLM's {'prompt': ...} / {'prompt_token_ids': ...}")
        n = len(prompt_token_ids)
        if isinstance(sampling_params, Sequence) and not isinstance(sampling_params, str):
            if len(sampling_params) != n:
                raise ValueError(
                    f"{len(sampling_params)} sampling_params for {n} prompts; give one or one per prompt"
                )
            params_list = list(sampling_params)
        else:
            params_list = [sampling_params] * n
        if arrival_times is not None:
            if len(arrival_times) != n:
                raise ValueError(f"{len(arrival_times)} arrival_times for {n} prompts")
            for i, a in enumerate(arrival_times):
                if not (isinstance(a, numbers.Real) and 0 <= a < math.inf):
                    raise ValueError(f"request {i}: arrival_times[{i}] must be a finite number "
                                     f">= 0 (s), got {a!r}")
        start = self.clock()
        offsets = [0.0] * n if arrival_times is None else [float(a) for a in arrival_times]
        reqs = []
        for i in range(n):
            rid = str(self._next_id + i)
            reqs.append(self.make_request(rid, prompt_token_ids[i], params_list[i],
                                          start + offsets[i], index=i))
        texts = {r.request_id: p for r, p in zip(reqs, prompt_token_ids) if isinstance(p, str)}
        self._next_id += n
        pending = sorted(range(n), key=lambda i: (offsets[i], i))
        k = 0
        try:
            while k < len(pending) or self.has_unfinished_requests():
                now = self.clock()
                while k < len(pending) and reqs[pending[k]].arrival_time <= now:
                    self.engine.add_request(reqs[pending[k]], now)
                    k += 1
                if self.has_unfinished_requests():
                    self.step()
                elif k < len(pending):
                    time.sleep(max(0.0, reqs[pending[k]].arrival_time - self.clock()))
        except BaseException:  # a failed step or Ctrl-C: the engine must serve the next call
            self._abandon({r.request_id for r in reqs})
            raise
        outputs = [self._output(req, texts.get(req.request_id)) for req in reqs]
        for o in outputs:  # handed out: forget them (long-lived engines must not grow)
            for r in o.requests:
                self.finished.pop(r.request_id, None)
        return outputs

    def _abort_in_flight(self, reason: str, request_ids: set[str] | None = None) -> None:
        """Finish every queued or running request (of `request_ids` and their n > 1 children;
        None: all) as aborted for `reason` (into `finished`, not reported by a later step),
        free their blocks and executor state, and drop the prefix cache: a step that failed
        part-way may have registered blocks whose KV it never wrote."""
        now = self.clock()
        for rid, req in list(self.engine.scheduler.requests.items()):
            if request_ids is None or rid in request_ids or req.parent_request_id in request_ids:
                self.engine.abort_request(rid, now, reason, report=False)
                self.runner.drop_request(rid)
                self.finished[rid] = req
        self.kv_cache_manager.block_pool.reset_prefix_cache()

    def _abandon(self, request_ids: set[str]) -> None:
        """Forget what a failed `generate` call left (its n > 1 children too): aborted by the
        failed step, or still queued when the call was interrupted between steps."""
        self._abort_in_flight("generate failed", request_ids)
        for rid, req in list(self.finished.items()):
            if rid in request_ids or req.parent_request_id in request_ids:
                del self.finished[rid]

    def chat(
        self,
        messages: Sequence[dict[str, str]] | Sequence[Sequence[dict[str, str]]],
        sampling_params: SamplingArg | Sequence[SamplingArg] = None,
    ) -> list[RequestOutput]:
        """vLLM's `LLM.chat`: one conversation (a list of {"role", "content"} messages) or a
        list of them, each rendered by the tokenizer's chat template with the assistant's
        turn opened, then generated as `generate` does."""
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer: load the model from a directory with "
                             "tokenizer files or pass LLM(..., tokenizer=DIR)")
        one = isinstance(messages, Sequence) and bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if one else messages
        if not isinstance(conversations, Sequence) or not conversations:
            raise ValueError("messages must be a conversation (a list of {'role', 'content'} "
                             "dicts) or a list of conversations")
        prompts = []
        for i, conv in enumerate(conversations):
            if not isinstance(conv, Sequence) or not conv:
                raise ValueError(f"conversation {i} must be a non-empty list of messages")
            for j, m in enumerate(conv):
                if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                        and isinstance(m.get("content"), str)):
                    raise ValueError(f"conversation {i}, message {j}: must be a dict with "
                                     f"string 'role' and 'content', got {m!r}")
            prompts.append(chat_token_ids(self.tokenizer, list(conv)))
        return self.generate(prompts, sampling_params)

    def warm_up(self, prompt_len: int, seed: int = 0x5EED) -> None:
        """One short untimed request (`prompt_len` random tokens, 2 output tokens), so first-call
        costs (allocator growth, kernel selection, lazy initialisation) are not charged to the
        first real request; its prefix-cache entries, KV statistics and request id are then
        forgotten, so what follows runs as on a fresh engine."""
        if self.has_unfinished_requests():
            raise RuntimeError("warm_up needs an idle engine")
        rng = random.Random(seed)
        prompt = [rng.randrange(self.vocab_size) for _ in range(max(1, prompt_len))]
        self.generate([prompt], {"max_tokens": 2, "ignore_eos": True, "temperature": 0.0})
        self.kv_cache_manager.block_pool.reset_prefix_cache()
        self.kv_cache_manager.reset_stats()
        self._next_id = 0

    def _output(self, parent: Request, prompt: str | None = None) -> RequestOutput:
        n = parent.sampling_params.n
        group = [parent] + [self.finished[f"{i}_{parent.request_id}"] for i in range(1, n)
                            if f"{i}_{parent.request_id}" in self.finished]
        return RequestOutput(
            request_id=parent.request_id,
            prompt_token_ids=list(parent.prompt_token_ids or []),
            arrival_time=parent.arrival_time,
            outputs=[CompletionOutput.from_request(i, r, self.tokenizer)
                     for i, r in enumerate(group)],
            requests=group,
            prompt=prompt,
        )
