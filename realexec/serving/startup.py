"""Start-up checks of `kvpd serve`, as `vllm serve` makes them: one request of the advertised
context length must fit each worker's KV pool."""

from __future__ import annotations

from typing import Any


def kv_capacity_tokens(model: dict[str, Any]) -> int:
    """Tokens one worker's KV pool holds (blocks x block size), from its `ready` model info."""
    return int(model["num_gpu_blocks"]) * int(model["block_size"])


def fit_max_model_len(models: dict[str, dict[str, Any]], requested: int | None) -> tuple[int, str | None]:
    """(max_model_len to advertise and enforce, a warning or None) for workers whose `ready`
    model infos are `models` (worker name -> info).

    A request of `max_model_len` tokens (prompt + output) must fit the smallest pool. When it
    does not: an explicit `requested` length is an error (ValueError, as vLLM's "max seq len
    is larger than the maximum number of tokens that can be stored in KV cache"); the model's
    own length is lowered to what fits, with a warning.
    """
    if not models:
        raise ValueError("no worker reported its model")
    model_len = min(int(m["max_model_len"]) for m in models.values())
    name, cap = min(((n, kv_capacity_tokens(m)) for n, m in models.items()), key=lambda x: x[1])
    if cap >= model_len:
        return model_len, None
    if requested is not None:
        raise ValueError(
            f"--max-model-len {requested} is larger than the {cap} tokens worker {name}'s KV "
            f"pool can hold ({models[name]['num_gpu_blocks']} blocks x "
            f"{models[name]['block_size']} tokens); raise --num-gpu-blocks or lower "
            "--max-model-len")
    return cap, (f"max_model_len lowered from {model_len} to {cap} tokens: worker {name}'s KV "
                 f"pool holds no more ({models[name]['num_gpu_blocks']} blocks x "
                 f"{models[name]['block_size']} tokens); longer requests get 400 "
                 "context_length_exceeded")
