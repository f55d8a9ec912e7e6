"""vLLM V1's hybrid KV cache layout for a model that mixes sliding-window and full-attention
layers (gpt-oss, Gemma 2/3): the layers split into KV cache groups of one size, the
full-attention layers' group and groups of sliding layers, each with its own block table from
the shared core (`CacheConfig.sliding_groups`). The cache keeps one tensor per position in a
group: layer j of every group writes tensor j, at its own group's block ids (one pool, so ids
never collide), so a block costs one group's layers, as vLLM's pages do.

Grouping as vLLM's `_get_kv_cache_groups_uniform_page_size` (v0.11.0): groups of the smaller
type's layer count; the sliding layers in groups of that size, layers[k::groups] in group k.
kvpd's core models one full-attention group, so a model with more full than sliding layers,
or whose layers are all of one kind, gets None (one table for every layer).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVGroups:
    """The layout: `group_layers` tensors; `sliding_groups` tables beside the full group's;
    `window` (tokens) the sliding layers read; `layer_map[l]` = (tensor, table) of KV layer
    `l` (table 0: the full group's, k > 0: sliding group k - 1's)."""

    group_layers: int
    sliding_groups: int
    window: int
    layer_map: tuple[tuple[int, int], ...]


def kv_groups(windows: list[int | None]) -> KVGroups | None:
    """The layout for KV layers whose windows are `windows` (None: full attention)."""
    full = [i for i, w in enumerate(windows) if not w]
    sliding = [i for i, w in enumerate(windows) if w]
    if not full or not sliding or len(full) > len(sliding):
        return None
    if len({windows[i] for i in sliding}) != 1:
        return None  # (one window for every sliding layer, as the core's groups have)
    size = len(full)
    groups = -(-len(sliding) // size)
    layer_map: dict[int, tuple[int, int]] = {layer: (j, 0) for j, layer in enumerate(full)}
    for k in range(groups):
        for j, layer in enumerate(sliding[k::groups]):
            layer_map[layer] = (j, 1 + k)
    return KVGroups(size, groups, int(windows[sliding[0]] or 0),
                    tuple(layer_map[i] for i in range(len(windows))))
