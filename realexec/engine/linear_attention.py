"""Linear-attention layers in the paged engine: Gated DeltaNet (Qwen3-Next, Qwen3.5's text
models) and Mamba-2 (Nemotron-H's state-space blocks, Granite 4.0's layers).

Such a layer keeps no KV per token but a fixed state per request: the last kernel - 1 inputs
of its causal convolution and a matrix per head (the delta rule's key_dim x value_dim,
Mamba-2's head_dim x ssm_state_size). Each request's states live in an HF cache of its own
(`transformers`' `DynamicCache`, whose linear-attention layers hold them); a step runs every
linear layer once per request over that request's slice of the flat batch, through the
layer's own HF module, which reads and updates the cache: a prompt chunk continues from the state its earlier chunks left (chunked prefill),
a decode takes one recurrent step. The core accounts the memory (`CacheConfig.state_blocks`);
these tensors are kept beside the KV pool, not in it.

A request that starts over (a first chunk, or recomputed after preemption) starts from a
zero state. A parallel-sampling child forks where its parent has computed all but its last
prompt token: the parent's state is copied at that point (`snapshot_forks`), whenever the
child is first scheduled.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, PretrainedConfig

from realexec.engine.kv_cache import KVCacheSpec
from simulator.core.request import Request

# model_type values whose layers mix Gated DeltaNet and (output-gated) softmax attention, and
# Nemotron-H and Granite 4.0, whose Mamba-2 layers HF's `layer_types` also names
# "linear_attention"
LINEAR_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "nemotron_h",
                                "granitemoehybrid"})


# a Mamba-2 family's config keys: heads, state size, head size, B/C groups, conv taps, and the
# state's dtype ("": the model's)
MAMBA2_KEYS = {
    "nemotron_h": ("mamba_num_heads", "ssm_state_size", "mamba_head_dim", "n_groups",
                   "conv_kernel", "mamba_ssm_cache_dtype"),
    "granitemoehybrid": ("mamba_n_heads", "mamba_d_state", "mamba_d_head", "mamba_n_groups",
                         "mamba_d_conv", ""),
}


def state_blocks(model: Any, kv: KVCacheSpec) -> int:
    """KV blocks (of `kv`'s size) one request's linear-attention state takes, counted as the
    simulator's memory plan counts it: per linear layer each head's state matrix (Gated
    DeltaNet: key_dim x value_dim per value head, in the config's `mamba_ssm_dtype`; Mamba-2:
    head_dim x ssm_state_size per head, in `mamba_ssm_cache_dtype`; else the model's dtype) and
    the last kernel - 1 convolution inputs; 0 without such layers."""
    num_linear = sum(model.linear)
    if not num_linear:
        return 0
    c = model.config
    elem = torch.empty((), dtype=kv.dtype).element_size()
    if c.model_type in MAMBA2_KEYS:  # conv over x, B and C; B and C per group
        heads, key_dim, value_dim, groups, kernel, state_dtype = (
            getattr(c, key) if key else None for key in MAMBA2_KEYS[c.model_type])
        conv_dim = heads * value_dim + 2 * groups * key_dim
    else:  # conv over q, k and v
        heads, key_dim, value_dim = (c.linear_num_value_heads, c.linear_key_head_dim,
                                     c.linear_value_head_dim)
        conv_dim = 2 * c.linear_num_key_heads * key_dim + heads * value_dim
        kernel, state_dtype = c.linear_conv_kernel_dim, getattr(c, "mamba_ssm_dtype", None)
    ssm = 4 if state_dtype == "float32" else elem
    per_layer = heads * key_dim * value_dim * ssm + (kernel - 1) * conv_dim * elem
    return -(-num_linear * per_layer // kv.bytes_per_block)


def linear_layers(config: PretrainedConfig) -> list[bool]:
    """Whether each layer is linear attention (HF's `layer_types`; none for other families)."""
    if config.model_type not in LINEAR_MODEL_TYPES:
        return [False] * config.num_hidden_layers
    return [t == "linear_attention" for t in config.layer_types[:config.num_hidden_layers]]


@dataclass(frozen=True, slots=True)
class Segment:
    """One request's slice of a step's flat batch."""

    request: Request
    start: int  # first row in the flat batch
    length: int  # tokens computed this step
    before: int  # tokens it had computed before this step


class LinearStates:
    """The linear-attention states of every request the engine is running, by request id."""

    def __init__(self, config: PretrainedConfig) -> None:
        self.config = config
        self.caches: dict[str, DynamicCache] = {}
        self.fork_points: dict[str, DynamicCache] = {}  # a parent's state at its fork point

    def begin_step(self, segments: list[Segment]) -> None:
        """Give each request of the step its state: a fresh one when it starts over, its
        parent's at the fork point for a parallel-sampling child seen the first time."""
        for s in segments:
            rid = s.request.request_id
            if s.before == 0:
                self.caches[rid] = DynamicCache(config=self.config)
            elif rid not in self.caches:
                parent = s.request.parent_request_id
                if parent is None or parent not in self.fork_points:
                    raise RuntimeError(f"request {rid!r} continues at token {s.before} with no "
                                       "linear-attention state")
                self.caches[rid] = copy.deepcopy(self.fork_points[parent])

    def snapshot_forks(self, segments: list[Segment]) -> None:
        """After a step: keep the state of each n > 1 request that reached its fork point
        (all but its last prompt token computed), for the children the core forks there."""
        for s in segments:
            r = s.request
            if r.sampling_params.n > 1 and r.parent_request_id is None and (
                    s.before + s.length == r.num_prompt_tokens - 1):
                self.fork_points[r.request_id] = copy.deepcopy(self.caches[r.request_id])

    def drop(self, request_id: str) -> None:
        """Forget a finished request's state."""
        self.caches.pop(request_id, None)
        self.fork_points.pop(request_id, None)

    def run(self, module: nn.Module, x: torch.Tensor, segments: list[Segment]) -> torch.Tensor:
        """The layer's output `[T, hidden]` for the flat batch `x`, one request at a time."""
        out = torch.empty_like(x)
        for s in segments:
            rows = slice(s.start, s.start + s.length)
            cache = self.caches[s.request.request_id]
            out[rows] = module(hidden_states=x[None, rows], cache=cache)[0]
        return out
