"""Chained content hashes of full KV blocks, from token ids or from trace block hashes.

Block i's hash covers the whole prefix up to and including block i (it chains the
parent's hash), so equal hashes mean equal prefixes, as in vLLM's prefix cache.
Python hashes of ints and tuples of ints do not depend on PYTHONHASHSEED, so the
hashes are identical across runs.

Traces such as Mooncake give one content hash per `hash_block_size` tokens
(512). Pool block i spans tokens [i*B, (i+1)*B) and its derived hash chains the
ids of every trace block that span overlaps plus i itself, so a 512-token trace
block maps onto 512/B distinct pool-block hashes, for any pool block size B.

A length-only request (no token ids, no trace hashes: a synthetic prompt of random ids, as
benchmark harnesses send) has content of its own that no other request shares: its block i
hashes (request id, i). It never hits another request's blocks, but after a preemption it
finds its own blocks that are still cached, as vLLM's prefix cache does for a preempted
request (its freed blocks keep their hashes until they are reused).
"""

from __future__ import annotations

import hashlib

from simulator.core.request import Request

# Seed of the hash chain (any fixed int; hash(None) is not stable across runs).
_ROOT_HASH = 0x6B7670645F726F6F  # "kvpd_roo"


def hash_token_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((_ROOT_HASH if parent_hash is None else parent_hash, token_ids))


def is_length_only(request: Request) -> bool:
    """Whether the request's content is known only as its own (no token ids, no trace hashes)."""
    return request.prompt_token_ids is None and request.prompt_hash_ids is None


def _own_root(request: Request) -> int:
    """A hash seed unique to the request and stable across runs (str hashes are salted)."""
    return int.from_bytes(hashlib.blake2b(str(request.request_id).encode(), digest_size=8).digest(),
                          "little")


def num_hashable_tokens(request: Request) -> int:
    """How many leading tokens of the request have known content (all of a length-only
    request's: they are its own)."""
    if request.prompt_token_ids is not None:
        return request.num_prompt_tokens + len(request.output_token_ids)
    if request.prompt_hash_ids is not None:
        return min(
            request.num_prompt_tokens, len(request.prompt_hash_ids) * request.hash_block_size
        )
    return request.num_tokens


def extend_block_hashes(request: Request, block_size: int, num_blocks: int) -> list[int]:
    """Extend `request.block_hashes` to cover up to `num_blocks` full blocks (fewer if the
    content of later blocks is unknown) and return it."""
    if request.block_hashes_block_size != block_size:  # e.g. P and D pools differ
        request.block_hashes = []
        request.block_hashes_block_size = block_size
    hashes = request.block_hashes
    have = len(hashes)
    if have >= num_blocks:
        return hashes
    num_blocks = min(num_blocks, num_hashable_tokens(request) // block_size)
    if have >= num_blocks:
        return hashes
    parent = hashes[-1] if hashes else None
    if is_length_only(request):
        root = _own_root(request) if parent is None else parent
        for i in range(have, num_blocks):
            root = hash((root, i))
            hashes.append(root)
    elif request.prompt_token_ids is not None:
        for i in range(have, num_blocks):
            tokens = tuple(request.token_ids_slice(i * block_size, (i + 1) * block_size))
            parent = hash_token_block(parent, tokens)
            hashes.append(parent)
    else:
        trace_ids = request.prompt_hash_ids
        assert trace_ids is not None  # (not length-only, no token ids: trace hashes)
        tb = request.hash_block_size
        for i in range(have, num_blocks):
            first = (i * block_size) // tb
            last = ((i + 1) * block_size - 1) // tb
            parent = hash((_ROOT_HASH if parent is None else parent, i, *trace_ids[first : last + 1]))
            hashes.append(parent)
    return hashes
