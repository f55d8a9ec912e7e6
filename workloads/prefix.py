"""Shared-prefix traffic: k system prompts reused by a fraction of requests.

Schema of a `shared_prefix` mapping:

- `num_prefixes`: k >= 1 distinct shared prefixes (system prompts)
- `prefix_len`: tokens per prefix, an integer >= 1 or a list of k integers
- `fraction`: share of requests (0..1) that start with a prefix; exactly
  round(fraction * num_requests) requests, chosen at random
- `weights`: optional list of k numbers >= 0 (prefix popularity; default equal)
- `block_size`: tokens per hash block, default 16 (vLLM's default KV block size)
- `vocab_size`: token ids are drawn uniformly from [0, vocab_size); default
  32000 (the Llama-2 tokenizer's vocabulary)
- `emit_token_ids`: also emit prompt token ids (for the real executor), default true

A sharing request's prompt is its prefix followed by `prompt_len` unique tokens
(the drawn `prompt_len` is the suffix). Every request gets block hash ids, one
per `block_size` tokens (the last block may be partial, as in Mooncake traces):
the full blocks inside a prefix get ids shared by all users of that prefix,
every other block a fresh id, which is what chained block hashing gives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workloads.ragged import Ragged
from workloads.spec import boolean, check_keys, check_mapping, number, require

_KEYS = (
    "num_prefixes",
    "prefix_len",
    "fraction",
    "weights",
    "block_size",
    "vocab_size",
    "emit_token_ids",
)
# vLLM's default KV-cache block size on GPUs (tokens): vllm/platforms/cuda.py sets 16
# when CacheConfig.block_size is unset.
DEFAULT_BLOCK_SIZE = 16
# Llama-2 tokenizer vocabulary (meta-llama/Llama-2-7b-hf config.json: vocab_size 32000).
DEFAULT_VOCAB_SIZE = 32000


def validate_shared_prefix(spec: Any, where: str = "shared_prefix") -> dict[str, Any]:
    """Checked, normalised copy of a `shared_prefix` mapping."""
    spec = check_mapping(spec, where)
    check_keys(spec, _KEYS, where)
    k = number(spec, "num_prefixes", where, lo=1, integer=True)
    lens = require(spec, "prefix_len", where, "tokens, an integer >= 1 or a list of them")
    if isinstance(lens, list):
        if len(lens) != k:
            raise ValueError(
                f"{where}.prefix_len: expected {k} lengths (num_prefixes), got {len(lens)}"
            )
        lens = [number({"prefix_len": v}, "prefix_len", where, lo=1, integer=True) for v in lens]
    else:
        lens = [number(spec, "prefix_len", where, lo=1, integer=True)] * k
    weights = spec.get("weights")
    if weights is None:
        weights = [1.0] * k
    elif not isinstance(weights, list) or len(weights) != k:
        raise ValueError(f"{where}.weights: expected a list of {k} numbers >= 0 (num_prefixes)")
    else:
        weights = [number({"weights": w}, "weights", where, lo=0) for w in weights]
        if sum(weights) <= 0:
            raise ValueError(f"{where}.weights: expected at least one weight > 0")
    return {
        "num_prefixes": k,
        "prefix_len": np.array(lens, dtype=np.int64),
        "fraction": number(spec, "fraction", where, lo=0, hi=1),
        "weights": np.array(weights) / sum(weights),
        "block_size": number(
            spec, "block_size", where, default=DEFAULT_BLOCK_SIZE, lo=1, integer=True
        ),
        "vocab_size": number(
            spec, "vocab_size", where, default=DEFAULT_VOCAB_SIZE, lo=2, integer=True
        ),
        "emit_token_ids": boolean(spec, "emit_token_ids", where, True),
    }


def apply_shared_prefix(
    spec: dict[str, Any], suffix_len: np.ndarray, seed_seq: np.random.SeedSequence
) -> tuple[np.ndarray, Ragged, Ragged | None]:
    """(prompt_len, hash_ids, prompt_token_ids or None) for requests with `suffix_len` unique tokens."""
    n = len(suffix_len)
    pick_rng, token_rng = (np.random.default_rng(s) for s in seed_seq.spawn(2))
    sharing = np.sort(pick_rng.permutation(n)[: int(round(spec["fraction"] * n))])
    which = np.full(n, -1, dtype=np.int64)
    which[sharing] = pick_rng.choice(spec["num_prefixes"], size=len(sharing), p=spec["weights"])
    lens = spec["prefix_len"]
    prefix_len = np.where(which >= 0, lens[np.maximum(which, 0)], 0)
    prompt_len = prefix_len + np.asarray(suffix_len, dtype=np.int64)
    hashes = _block_hashes(prompt_len, which, lens // spec["block_size"], spec["block_size"])
    tokens = None
    if spec["emit_token_ids"]:
        tokens = _token_ids(prompt_len, which, lens, spec["vocab_size"], token_rng)
    return prompt_len, hashes, tokens


def _block_hashes(
    prompt_len: np.ndarray, which: np.ndarray, full_blocks: np.ndarray, block_size: int
) -> Ragged:
    base = np.concatenate([[0], np.cumsum(full_blocks)])  # first id of each prefix's blocks
    n_blocks = -(-prompt_len // block_size)
    shared = np.where(which >= 0, full_blocks[np.maximum(which, 0)], 0)
    starts = np.cumsum(n_blocks) - n_blocks
    pos = np.arange(int(n_blocks.sum()), dtype=np.int64) - np.repeat(starts, n_blocks)
    is_shared = pos < np.repeat(shared, n_blocks)
    unique_ids = base[-1] + np.cumsum(~is_shared) - 1
    values = np.where(is_shared, np.repeat(base[np.maximum(which, 0)], n_blocks) + pos, unique_ids)
    return Ragged.from_lengths(values.astype(np.int64), n_blocks)


def _token_ids(
    prompt_len: np.ndarray,
    which: np.ndarray,
    lens: np.ndarray,
    vocab_size: int,
    rng: np.random.Generator,
) -> Ragged:
    prefixes = [rng.integers(0, vocab_size, size=int(n), dtype=np.int32) for n in lens]
    values = rng.integers(0, vocab_size, size=int(prompt_len.sum()), dtype=np.int32)
    starts = np.cumsum(prompt_len) - prompt_len
    for k, tokens in enumerate(prefixes):
        rows = np.flatnonzero(which == k)
        if len(rows):
            values[(starts[rows][:, None] + np.arange(len(tokens))).ravel()] = np.tile(
                tokens, len(rows)
            )
    return Ragged.from_lengths(values, prompt_len)
