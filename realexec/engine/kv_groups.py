"""vLLM V1's hybrid KV cache layout for a model that mixes sliding-window and full-attention
layers (gpt-oss, Gemma 2/3): the layers split into KV cache groups of one size, the
full-attention layers' group and groups of sliding layers, each with its own block table from
the shared core (`CacheConfig.sliding_groups`). The cache keeps one tensor per position in a
group: layer j of every group writes tensor j, at its own group's block ids (one pool, so ids
never collide), so a block costs one group's layers, as vLLM's pages do.

Grouping as the core's `group_layout` (vLLM's rule), the sliding layers layers[k::groups] in
group k as vLLM assigns them; None: one table for every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.core.window_groups import group_layout


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
    layout = group_layout(len(full), len(sliding))
    if layout is None or len({windows[i] for i in sliding}) != 1:
        return None  # (one window for every sliding layer, as the core's groups have)
    size, groups = layout
    layer_map: dict[int, tuple[int, int]] = {layer: (j, 0) for j, layer in enumerate(full)}
    for k in range(groups):
        for j, layer in enumerate(sliding[k::groups]):
            layer_map[layer] = (j, 1 + k)
    return KVGroups(size, groups, int(windows[sliding[0]] or 0),
                    tuple(layer_map[i] for i in range(len(windows))))
