"""The memory plan of one replica: weights + activation reserve + KV-cache pool per GPU.

As vLLM: each GPU may use `gpu_memory_utilization` x its memory; the weights of its TP/PP
slice and a reserve for activations (peak of a `max_num_batched_tokens` forward pass) and
runtime buffers come off the top; what remains is the KV pool, cut into blocks of
`block_size` tokens. The replica's block count is the smallest over its GPUs (every stage
stores the KV of its own layers for the same tokens).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from simulator.core.window_groups import group_layout
from simulator.cost.dtypes import dtype_bytes, normalize_dtype
from simulator.cost.hardware import Accelerator, get_accelerator
from simulator.cost.models import ModelSpec, get_model
from simulator.cost.moe_cost import stage_layer_split
from simulator.cost.parallel import ShardPlan, shard_model
from simulator.cost.precision import Precision, resolve

GB = 1e9
# the engines' ways to size the KV pool (a scenario's `cache` names one): vLLM's share of all
# memory for weights, activations and KV; TensorRT-LLM's share of what weights and activations
# leave; SGLang's share of all memory for weights and KV (see `plan_memory`)
MEMORY_RULES = ("gpu_memory_utilization", "free_gpu_memory_fraction", "mem_fraction_static")
# CUDA context, NCCL buffers, cuBLAS workspaces and CUDA-graph pools outside PyTorch's
# allocator: vLLM's startup log reports ~0.5-2 GiB of "non-torch memory" on an H100; 1 GiB.
NON_TORCH_RESERVE_BYTES = 2**30


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU (the fullest GPU of the replica) and the replica's KV blocks."""

    model: str
    hardware: str
    dtype: str
    quantization: str | None  # method (fp8, w8a8, awq, gptq) or None
    kv_cache_dtype: str
    tp: int
    pp: int
    block_size: int  # tokens per KV block
    gpu_memory_utilization: float
    memory_bytes: int  # one GPU's memory
    budget_bytes: float  # the fraction x memory_bytes (all of it: free_gpu_memory_fraction)
    weight_bytes_per_gpu: float  # largest over the PP stages
    activation_reserve_bytes: float
    kv_pool_bytes: float  # per GPU
    kv_bytes_per_block: float  # per GPU (its TP slice of its stage's layers)
    num_gpu_blocks: int
    ep: int = 1
    expert_weight_bytes_per_gpu: float = 0.0  # routed experts' share of weight_bytes_per_gpu
    # TensorRT-LLM's sizing: the KV pool is this fraction of the memory left after weights and
    # activations (None: vLLM's, gpu_memory_utilization of all memory for all of it)
    free_gpu_memory_fraction: float | None = None
    # SGLang's sizing: weights + KV take this fraction of all memory, activations the rest
    mem_fraction_static: float | None = None
    # data-parallel attention: every GPU holds whole attention weights and its own requests'
    # KV (all KV heads); num_gpu_blocks is then one GPU's (one attention rank's) pool
    dp_attention: bool = False
    # linear-attention layers (Qwen3-Next, Qwen3.5): one request's recurrent state on the
    # fullest GPU, bytes, and the KV blocks it takes from the pool (vLLM V1 keeps it there)
    state_bytes_per_request: float = 0.0
    state_blocks_per_request: int = 0
    # vLLM V1's hybrid KV cache manager (a model mixing sliding-window and full-attention
    # layers): a block holds this many layers (0: every layer), one group's, and each request
    # also holds `sliding_groups` blocks per block position its sliding layers still read
    kv_group_layers: int = 0
    sliding_groups: int = 0

    @property
    def max_num_tokens(self) -> int:
        """KV tokens the replica can hold (blocks x block size); with KV cache groups, those
        of the full-attention layers, less each request's sliding-window blocks."""
        return self.num_gpu_blocks * self.block_size

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "max_num_tokens": self.max_num_tokens}


def default_activation_reserve(model: ModelSpec, tp: int, dtype: str,
                               max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> float:
    """Bytes for the peak forward pass of `max_num_batched_tokens` tokens on one GPU plus
    runtime buffers: the widest live tensors (hidden state and residual, QKV, the MLP's
    gate/up output), fp32 logits of `max_num_seqs` requests, and `NON_TORCH_RESERVE_BYTES`.
    vLLM measures this with a profiling run; this is its analytical counterpart."""
    sh = shard_model(model, tp, 1)
    ab = 4.0 if normalize_dtype(dtype) == "fp32" else 2.0
    d = model.hidden_size
    width = (3 * d + (sh.heads + 2 * sh.kv_heads) * model.head_dim
             + (3 if model.gated_mlp else 2) * sh.ffn * model.experts_per_token)
    logits = max_num_seqs * model.vocab_size * 4
    return max_num_batched_tokens * width * ab + logits + NON_TORCH_RESERVE_BYTES


def plan_memory(model: ModelSpec | str, accelerator: Accelerator | str | dict, dtype: str = "bf16",
                tp: int = 1, pp: int = 1, block_size: int = 16,
                gpu_memory_utilization: float = 0.9,
                activation_reserve_bytes: float | None = None, *,
                kv_cache_dtype: str | None = None,
                max_num_batched_tokens: int = 8192,
                quantization: dict[str, Any] | str | None = None, ep: int = 1,
                free_gpu_memory_fraction: float | None = None,
                mem_fraction_static: float | None = None,
                dp_attention: bool = False, hybrid_kv_cache: bool = False) -> MemoryPlan:
    """Plan one replica's memory; ValueError when the weights (or weights + reserve) do not fit,
    naming the model, hardware, TP/PP and the shortfall in GB.

    The KV pool is vLLM's `gpu_memory_utilization` x memory - weights - activation reserve,
    or, with `free_gpu_memory_fraction` (TensorRT-LLM's KvCacheConfig; its default 0.9), that
    fraction of memory - weights - activation reserve, or, with `mem_fraction_static`
    (SGLang's), that fraction of memory - weights (its activations live outside it). Then
    `gpu_memory_utilization` is not used; give at most one of the two.

    `dp_attention` (data-parallel attention over the tp GPUs, pp = 1): each GPU holds the
    whole attention weights (the rest split as at tp / ep) and a KV pool of its own with every
    KV head, for the requests its attention rank runs.

    `hybrid_kv_cache` (vLLM V1's hybrid KV cache manager): for a model whose layers
    `kv_cache_groups` splits into groups, a block holds one group's layers (pp = 1)."""
    model = model if isinstance(model, ModelSpec) else get_model(model)
    acc = accelerator if isinstance(accelerator, Accelerator) else get_accelerator(accelerator)
    prec = resolve(acc, dtype, quantization, kv_cache_dtype, model=model)
    dt, kv_dt = prec.dtype, prec.kv_cache_dtype
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    free_fraction, static = free_gpu_memory_fraction, mem_fraction_static
    for key, v in (("free_gpu_memory_fraction", free_fraction), ("mem_fraction_static", static)):
        if v is not None and not 0 < v <= 1:
            raise ValueError(f"{key} must be in (0, 1], got {v}")
    if free_fraction is not None and static is not None:
        raise ValueError("give at most one of free_gpu_memory_fraction and mem_fraction_static")
    sh = shard_model(model, tp, pp, ep)
    if free_fraction is not None:
        budget, limit = acc.memory_bytes, "the whole memory"
    else:
        share, key = ((static, "mem_fraction_static") if static is not None
                      else (gpu_memory_utilization, "gpu_memory_utilization"))
        budget = share * acc.memory_bytes
        limit = f"{key}={share} x {acc.memory_bytes / GB:.1f} GB"
    weights = max(stage_weight_bytes(model, sh, prec))
    kv_sh = sh
    if dp_attention:
        if pp != 1:
            raise ValueError(f"data-parallel attention runs at pp = 1, got pp={pp}")
        kv_sh = shard_model(model, 1, 1)
        weights += model.num_layers * (attention_weight_bytes(model, kv_sh, prec)
                                       - attention_weight_bytes(model, sh, prec))
    experts = routed_expert_bytes_per_gpu(model, sh, prec.matrix_weight_bytes)
    where = (f"{model.name} at {dt} on {acc.name} with tp={tp}, pp={pp}"
             + (f", ep={ep}" if ep > 1 else "") + (", dp attention" if dp_attention else "")
             + " "
             f"({tp * pp} GPU{'s' if tp * pp > 1 else ''})")
    if weights > budget:
        raise ValueError(
            f"weights do not fit: {where} needs {weights / GB:.1f} GB of weights per GPU but "
            f"{limit} allows {budget / GB:.1f} GB; short by {(weights - budget) / GB:.1f} GB. "
            "Raise tp/pp, use a smaller dtype, or larger hardware.")
    if static is not None:
        reserve = 0.0  # (outside the static fraction)
    elif activation_reserve_bytes is None:
        reserve = default_activation_reserve(model, tp, dt, max_num_batched_tokens)
    else:
        if activation_reserve_bytes < 0:
            raise ValueError(f"activation_reserve_bytes must be >= 0, got {activation_reserve_bytes}")
        reserve = float(activation_reserve_bytes)
    pool = budget - weights - reserve
    if free_fraction is not None:
        pool *= free_fraction
    if model.is_mla:  # the latent + rope key (+ a sparse-attention indexer key), replicated
        # on every TP rank (as vLLM)
        kv_per_block = block_size * max(sh.layers_per_stage) * model.mla_kv_bytes(kv_dt)
    else:  # (the softmax-attention layers': linear-attention ones keep a state instead)
        full = model.num_full_attention_layers / model.num_layers
        kv_per_block = (block_size * max(sh.layers_per_stage) * full * 2 * kv_sh.kv_heads
                        * model.head_dim * dtype_bytes(kv_dt))
    groups = kv_cache_groups(model) if hybrid_kv_cache and pp == 1 else None
    if groups:  # one group's layers per block
        kv_per_block = (block_size * groups[0] * 2 * kv_sh.kv_heads * model.head_dim
                        * dtype_bytes(kv_dt))
    state = 0.0
    if model.has_linear_attention:  # its heads split as the KV's (a DP attention rank holds
        # them all), its layers over the stages
        state = (model.linear_state_bytes(dt) / kv_sh.tp
                 * max(sh.layers_per_stage) / model.num_layers)
    if pool < kv_per_block:
        raise ValueError(
            f"no room for the KV cache: {where} uses {weights / GB:.1f} GB of weights and "
            f"{reserve / GB:.1f} GB of activation reserve of {budget / GB:.1f} GB; short by "
            f"{(kv_per_block - pool) / GB:.2f} GB for even one block.")
    return MemoryPlan(
        model=model.name, hardware=acc.name, dtype=dt, quantization=prec.method,
        kv_cache_dtype=kv_dt, tp=tp, pp=pp,
        block_size=block_size, gpu_memory_utilization=gpu_memory_utilization,
        memory_bytes=acc.memory_bytes, budget_bytes=budget, weight_bytes_per_gpu=weights,
        activation_reserve_bytes=reserve, kv_pool_bytes=pool, kv_bytes_per_block=kv_per_block,
        num_gpu_blocks=int(pool // kv_per_block), ep=ep, expert_weight_bytes_per_gpu=experts,
        free_gpu_memory_fraction=free_fraction, mem_fraction_static=static,
        dp_attention=dp_attention, state_bytes_per_request=state,
        state_blocks_per_request=-int(-state // kv_per_block),
        kv_group_layers=groups[0] if groups else 0, sliding_groups=groups[1] if groups else 0)


def mamba_block_size(model: ModelSpec, tp: int, dtype: str, kv_cache_dtype: str) -> int:
    """The attention block size (tokens) vLLM V1 gives a model with linear-attention layers
    (`HybridAttentionMambaModelConfig`, v0.10.2-v0.11.0): the smallest multiple of 16 tokens
    whose KV page on one layer of one GPU holds one layer's recurrent state, so that one
    block of a group of layers holds that group's states. `dtype` is the weights' (the state's
    dtype follows, `ModelSpec.linear_state_bytes`), `kv_cache_dtype` the KV's (auto: the
    16-bit activations')."""
    kv = max(1, model.num_kv_heads // tp)  # (replicated below one head per GPU)
    kv_bytes = (dtype_bytes(kv_cache_dtype) if kv_cache_dtype != "auto"
                else 4 if dtype == "fp32" else 2)
    page_per_token = 2 * kv * model.head_dim * kv_bytes
    state = model.linear_state_bytes(dtype) / model.num_linear_layers / tp
    return 16 * -int(-state // (16 * page_per_token))


def kv_cache_groups(model: ModelSpec) -> tuple[int, int] | None:
    """(layers per group, groups of sliding layers) under vLLM V1's hybrid KV cache manager for
    a model that mixes sliding-window and full-attention layers; None where kvpd keeps one
    block table for every layer.

    The core's `group_layout` (vLLM's grouping): gpt-oss 18 + 18 layers -> 1 full + 1 sliding
    group of 18; Gemma 3 27B 10 full + 52 sliding -> 1 + 6 of 10. Not for MLA,
    linear-attention or Llama 4's chunked attention (vLLM turns the manager off for chunked
    local attention by default)."""
    if (not model.sliding_window or model.is_mla or model.has_linear_attention
            or model.architecture.startswith("Llama4")):
        return None
    sliding = model.num_sliding_layers
    return group_layout(model.num_full_attention_layers - sliding, sliding)


def attention_weight_bytes(model: ModelSpec, sh: ShardPlan, prec: Precision) -> float:
    """Bytes of one layer's attention weights on one rank under `prec`: the q/k/v and output
    projections each at their scope's bytes per weight (`Precision.of`)."""
    qkv, o = sh.attention_split(model)
    return (qkv * prec.of("qkv").matrix_weight_bytes
            + o * prec.of("o_proj").matrix_weight_bytes)


def stage_weight_bytes(model: ModelSpec, sh: ShardPlan, prec: Precision) -> list[float]:
    """Weight bytes on one GPU of each PP stage under `prec`: with quantization scope
    `experts`, the routed experts at the method's bytes and every other matrix in 16 bits;
    with `mlp` / `mlp_and_o_proj`, every matrix at the method's bytes but the attention
    projections the scope leaves out."""
    if prec.scope == "all":
        return sh.stage_weight_bytes(model, prec.dtype, prec.matrix_weight_bytes)
    if prec.scope != "experts":
        extra = (attention_weight_bytes(model, sh, prec)
                 - sh.attention_params(model) * prec.matrix_weight_bytes)
        return [b + layers * extra for b, layers in zip(
            sh.stage_weight_bytes(model, prec.dtype, prec.matrix_weight_bytes),
            sh.layers_per_stage, strict=True)]
    dense = prec.dense
    extra = prec.matrix_weight_bytes - dense.matrix_weight_bytes  # per routed-expert weight
    return [b + n * extra for b, n in zip(
        sh.stage_weight_bytes(model, dense.dtype, dense.matrix_weight_bytes),
        routed_expert_params_per_gpu(model, sh), strict=True)]


def routed_expert_params_per_gpu(model: ModelSpec, sh: ShardPlan) -> list[float]:
    """Routed-expert weights on one GPU of each PP stage: every expert's 1/tp column slice
    (ep = 1), or num_experts/ep whole experts (ep = tp), over the stage's MoE layers."""
    if not model.is_moe:
        return [0.0] * sh.pp
    per_expert = (3 if model.gated_mlp else 2) * model.expert_width * sh.ffn
    experts = model.num_experts / sh.ep if sh.ep > 1 else model.num_experts
    return [stage_layer_split(model, sh.layers_per_stage, s)[1] * experts * per_expert
            for s in range(sh.pp)]


def routed_expert_bytes_per_gpu(model: ModelSpec, sh: ShardPlan, matrix_bytes: float) -> float:
    """Bytes of routed-expert weights on the fullest GPU, `matrix_bytes` per weight (the
    precision's, with its quantization groups)."""
    return max(routed_expert_params_per_gpu(model, sh)) * matrix_bytes


def mixed_window_note(model: ModelSpec, kv_group_layers: int = 0,
                      sliding_groups: int = 0) -> str | None:
    """For a model that mixes sliding-window and full-attention layers (gpt-oss, Gemma 3,
    Llama 4): how kvpd's KV plan holds the sliding layers' KV, as a sentence; None for other
    models. With KV cache groups (a plan's `kv_group_layers` and `sliding_groups`, vLLM V1's
    hybrid KV cache manager) they hold only the window. Otherwise a kvpd block holds every layer's KV, so the plan keeps
    the whole context on the sliding layers too; engines that give each attention type its
    own blocks hold up to layers / full layers x the tokens at contexts much longer than the
    window."""
    sliding, layers = model.num_sliding_layers, model.num_layers
    if not model.sliding_window or sliding in (0, layers):
        return None
    if sliding_groups:
        return (f"{sliding} of {layers} layers attend to a {model.sliding_window:,}-token "
                "window: as vLLM V1's hybrid KV cache manager, a KV block holds one group of "
                f"{kv_group_layers} layers, the full-attention layers' table keeps the "
                f"whole context and each of {sliding_groups} sliding groups only the "
                "blocks of the window and of the tokens a step adds (a prefix hit needs "
                "every sliding group's window before it cached)")
    return (f"{sliding} of {layers} layers attend to a {model.sliding_window:,}-token window, "
            "but a kvpd KV block holds every layer, so the plan keeps the whole context on "
            "all of them; engines that give each attention type its own blocks (vLLM V1's "
            "hybrid KV cache manager) keep only the window there, up to "
            f"{layers / (layers - sliding):.1f}x the KV tokens at long contexts: kvpd's KV "
            "capacity is low and its preemptions high against them")


def linear_attention_note(model: ModelSpec, plan: MemoryPlan | None = None) -> str | None:
    """For a model with linear-attention layers (Qwen3-Next, Qwen3.5): what each request holds
    besides its KV blocks and what kvpd leaves out, as a sentence; None for other models."""
    if not model.has_linear_attention:
        return None
    out = (f"{model.num_linear_layers} of {model.num_layers} layers are {model.linear_mixer}: "
           "a fixed-size recurrent state per request instead of KV per token")
    if plan is not None:
        out += (f" ({plan.state_bytes_per_request / 2**20:,.1f} MiB per GPU, "
                f"{plan.state_blocks_per_request} KV blocks of the pool from its first step "
                "to its end, as vLLM V1 keeps it)")
    return (out + "; prefix caching is off for it (the state of a prefix is not cached), and "
            "swap preemption is refused")
