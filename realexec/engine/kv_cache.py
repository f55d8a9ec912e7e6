"""The paged KV cache: one device tensor of fixed-size blocks per layer, plus a host pool.

Layout: `kv[layer, 0|1, slot, kv_head, head_dim]` with `slot = block_id * block_size + offset`,
i.e. per layer a key and a value tensor of `[num_blocks * block_size, kv_heads, head_dim]`.
Multi-head latent attention (DeepSeek MLA) caches one plane instead of two: per token the
normalised KV latent and the rotary key, `[slot, 1, kv_lora_rank + qk_rope_head_dim]`
(`num_planes=1`), which is what sizes its pool.
One extra *null block* after the last usable one stays zero: padded gathers point at it, so
masked-out keys never carry NaN garbage into attention (0 * NaN would poison the output).
Block ids are the ones the core's `KVCacheManager` hands out; the host pool (swap
preemption) has its own ids.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# vLLM's CPU backend reserves 4 GiB for the KV cache unless told otherwise
# (VLLM_CPU_KVCACHE_SPACE, vllm/envs.py); we use the same default cap on CPU.
DEFAULT_CPU_KV_CACHE_BYTES = 4 * 1024**3


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the KV cache of one model (sizes in tokens, elements and bytes)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype
    num_planes: int = 2  # K and V; 1 for an MLA latent cache

    @property
    def bytes_per_token(self) -> int:
        """K and V (or the MLA latent) of one token over all layers, bytes."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return self.num_planes * self.num_layers * self.num_kv_heads * self.head_dim * elem

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size


def total_memory_bytes(device: torch.device) -> int:
    """Physical memory of `device` (bytes): the GPU's, or the host RAM for cpu/mps."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def num_blocks_from_budget(
    spec: KVCacheSpec,
    device: torch.device,
    gpu_memory_utilization: float,
    used_bytes: int,
    cpu_kv_cache_bytes: int = DEFAULT_CPU_KV_CACHE_BYTES,
) -> int:
    """Blocks that fit in `gpu_memory_utilization` x device memory minus `used_bytes`.

    `used_bytes` is what the model already takes (weights + peak activations, bytes), as
    vLLM's `determine_num_available_blocks` measures by profiling. On CPU the budget is further
    capped at `cpu_kv_cache_bytes`.
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(
            f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
        )
    budget = int(total_memory_bytes(device) * gpu_memory_utilization) - int(used_bytes)
    if device.type == "cpu":
        budget = min(budget, cpu_kv_cache_bytes)
    num_blocks = budget // spec.bytes_per_block
    if num_blocks < 1:
        raise ValueError(
            f"no room for the KV cache: {gpu_memory_utilization:.2f} of "
            f"{total_memory_bytes(device) / 2**30:.1f} GiB on {device} minus "
            f"{used_bytes / 2**30:.2f} GiB in use leaves less than one block "
            f"({spec.bytes_per_block} bytes); raise gpu_memory_utilization or give num_gpu_blocks"
        )
    return int(num_blocks)


class PagedKVCache:
    """Device block pool for all layers, a host pool for swapping, and the copies between."""

    def __init__(
        self, spec: KVCacheSpec, num_blocks: int, device: torch.device, num_cpu_blocks: int = 0
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        self.spec = spec
        self.num_blocks = num_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.device = device
        bs = spec.block_size
        if spec.num_planes not in (1, 2):
            raise ValueError(f"num_planes must be 1 (MLA latent) or 2 (K and V), got {spec.num_planes}")
        planes = spec.num_planes
        shape = (spec.num_layers, planes, (num_blocks + 1) * bs, spec.num_kv_heads, spec.head_dim)
        # torch.empty: pages are only touched when written (a large CPU pool stays lazy).
        self.kv = torch.empty(shape, dtype=spec.dtype, device=device)
        self.null_slot = num_blocks * bs
        self.kv[:, :, self.null_slot :].zero_()
        host_shape = (spec.num_layers, planes, num_cpu_blocks * bs, spec.num_kv_heads, spec.head_dim)
        pin = device.type == "cuda"
        self.host = torch.empty(host_shape, dtype=spec.dtype, device="cpu", pin_memory=pin)

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    def key_cache(self, layer: int) -> torch.Tensor:
        """`[ (num_blocks + 1) * block_size, kv_heads, head_dim ]` keys of `layer`."""
        return self.kv[layer, 0]

    def value_cache(self, layer: int) -> torch.Tensor:
        """Values of `layer` (the latent itself for a one-plane MLA cache)."""
        return self.kv[layer, -1]

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor | None) -> None:
        """Store `k`, `v` (`[num_tokens, kv_heads, head_dim]`) at `slot_mapping` (`[num_tokens]`);
        `v` is None for a one-plane (MLA latent) cache."""
        self.kv[layer, 0].index_copy_(0, slot_mapping, k)
        if v is not None:
            self.kv[layer, 1].index_copy_(0, slot_mapping, v)

    def _slots(self, block_ids: list[int], device: torch.device) -> torch.Tensor:
        bs = self.block_size
        ids = torch.tensor(block_ids, dtype=torch.long, device=device)
        return (ids[:, None] * bs + torch.arange(bs, device=device)).reshape(-1)

    def _check(self, pairs: list[tuple[int, int]], src_n: int, dst_n: int, what: str) -> None:
        for s, d in pairs:
            if not (0 <= s < src_n and 0 <= d < dst_n):
                raise ValueError(f"{what}: block pair ({s}, {d}) out of range ({src_n}, {dst_n})")

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks to host blocks: `[(device_block, host_block), ...]`."""
        if not pairs:
            return
        self._check(pairs, self.num_blocks, self.num_cpu_blocks, "swap_out")
        src = self._slots([p[0] for p in pairs], self.device)
        dst = self._slots([p[1] for p in pairs], torch.device("cpu"))
        self.host[:, :, dst] = self.kv[:, :, src].to("cpu")

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy host blocks to device blocks: `[(host_block, device_block), ...]`."""
        if not pairs:
            return
        self._check(pairs, self.num_cpu_blocks, self.num_blocks, "swap_in")
        src = self._slots([p[0] for p in pairs], torch.device("cpu"))
        dst = self._slots([p[1] for p in pairs], self.device)
        self.kv[:, :, dst] = self.host[:, :, src].to(self.device, non_blocking=True)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Device-to-device block copies `[(src_block, dst_block), ...]` (copy-on-write)."""
        if not pairs:
            return
        self._check(pairs, self.num_blocks, self.num_blocks, "copy_blocks")
        src = self._slots([p[0] for p in pairs], self.device)
        dst = self._slots([p[1] for p in pairs], self.device)
        self.kv[:, :, dst] = self.kv[:, :, src]
