"""SGLang's server defaults by version, for `engine: {name: sglang, version: ...}`.

Read from the released wheels' `sglang/srt/server_args.py` (`ServerArgs.__post_init__` /
`_handle_gpu_memory_settings`) and `model_executor/model_runner.py` (`init_memory_pool`).
`gpu_mem` is one GPU's memory in MiB, as SGLang reads it.

- `chunked_prefill_size` (kvpd: `scheduler.max_num_batched_tokens`; a prefill batch holds at
  most that many tokens):
  0.4.0-0.4.6: 2048 below 25,000 MiB, else 8192. 0.4.7: 16384 above 180,000 MiB, 2048 below
  25,000, else 8192. 0.4.8-0.5.2: 2048 below 35 GiB, 8192 below 160 GiB, else 16384.
  From 0.5.3: 2048 below 35 GiB, 4096 below 60, 8192 below 160, else 16384.
- `mem_fraction_static` (kvpd: `cache.mem_fraction_static`, weights + KV over all memory):
  0.4.0-0.4.6: by TP size, 0.88 (1), 0.87 (>= 2), 0.85 (>= 4), 0.81 (>= 8), 0.79 (>= 16);
  0.4.6 above 81,920 MiB: (gpu_mem - 13 GiB) / gpu_mem.
  0.4.7: the same by TP x PP up to 81,920 MiB (0.88 above); above 180,000 MiB 0.79; above 96 GiB
  min(f + 48 GiB x (1 - f) / gpu_mem, (gpu_mem - 18 GiB) / gpu_mem).
  0.4.8-0.5.2: (gpu_mem - reserved) / gpu_mem, reserved (GiB) 2.8 + TP x PP / 10 below 35 GiB,
  9.5 + TP x PP / 2 below 90, 12 + TP x PP / 2 below 160, else 32.
  From 0.5.3: reserved (MiB) = 512 + 1.5 x max(chunked_prefill_size, 2048) + 2 x
  cuda_graph_max_bs + TP x PP / 8 x 1024, at least 10 GiB above 60 GiB; cuda_graph_max_bs is
  8 below 20 GiB, below 35 GiB 16 (24 from 0.5.4) or 80 with TP >= 4, below 60 GiB 32 or 160,
  below 160 GiB 256 or 512, else 512. Rounded to 3 decimals in both later rules.
- `max_running_requests` (kvpd: `scheduler.max_num_seqs`), every version: the request pool,
  min(max(KV tokens / context length x 512, 2048), 4096).

Versions before 0.4.0 are not modelled (kvpd's defaults stay, and the note says so).
Speculative decoding and DP attention, which reserve more, are not modelled either.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from simulator.engines.version import parse_version

FIRST_MODELLED = Version("0.4.0")
GIB = 1024  # MiB


def chunked_prefill_size(v: Version, gpu_mem: float) -> int:
    """SGLang `v`'s default chunked_prefill_size (tokens) on a GPU of `gpu_mem` MiB."""
    if v < Version("0.4.7"):
        return 2048 if gpu_mem < 25_000 else 8192
    if v < Version("0.4.8"):
        return 16384 if gpu_mem > 180_000 else 2048 if gpu_mem < 25_000 else 8192
    if gpu_mem < 35 * GIB:
        return 2048
    if v >= Version("0.5.3") and gpu_mem < 60 * GIB:
        return 4096
    return 8192 if gpu_mem < 160 * GIB else 16384


def _by_parallel(size: int) -> float:
    return 0.79 if size >= 16 else 0.81 if size >= 8 else 0.85 if size >= 4 else \
        0.87 if size >= 2 else 0.88


def cuda_graph_max_bs(v: Version, gpu_mem: float, tp: int) -> int:
    """From 0.5.3: the largest batch SGLang captures a CUDA graph for (it sizes the reserve)."""
    if gpu_mem < 20 * GIB:
        return 8
    if gpu_mem < 35 * GIB:
        return (24 if v >= Version("0.5.4") else 16) if tp < 4 else 80
    if gpu_mem < 60 * GIB:
        return 32 if tp < 4 else 160
    if gpu_mem < 160 * GIB:
        return 256 if tp < 4 else 512
    return 512


def mem_fraction_static(v: Version, gpu_mem: float, tp: int, pp: int) -> float:
    """SGLang `v`'s default mem_fraction_static on a GPU of `gpu_mem` MiB with TP x PP."""
    size = tp * pp
    if v < Version("0.4.7"):
        if v >= Version("0.4.6") and gpu_mem > 81920:
            return (gpu_mem - 13 * GIB) / gpu_mem
        return _by_parallel(tp)
    if v < Version("0.4.8"):
        f = _by_parallel(size) if gpu_mem <= 81920 else 0.88
        if gpu_mem > 180_000:
            return 0.79
        if gpu_mem > 96 * GIB:
            return min(f + 48 * GIB * (1 - f) / gpu_mem, (gpu_mem - 18 * GIB) / gpu_mem)
        return f
    if v < Version("0.5.3"):
        reserved = (2.8 + size / 10 if gpu_mem < 35 * GIB else 9.5 + size / 2
                    if gpu_mem < 90 * GIB else 12 + size / 2 if gpu_mem < 160 * GIB else 32) * GIB
    else:
        chunk = chunked_prefill_size(v, gpu_mem)
        reserved = (512 + 1.5 * max(chunk, 2048) + 2 * cuda_graph_max_bs(v, gpu_mem, tp)
                    + size / 8 * GIB)
        if gpu_mem > 60 * GIB:
            reserved = max(reserved, 10 * GIB)
    return round((gpu_mem - reserved) / gpu_mem, 3)


def max_running_requests(kv_tokens: int, context_len: int) -> int:
    """SGLang's default request pool for `kv_tokens` of KV and a `context_len`-token context."""
    return min(max(int(kv_tokens / context_len * 512), 2048), 4096)


def fill_max_running(sc: Any) -> list[str]:
    """For a validated scenario `sc` standing for an SGLang server of a modelled version (no PD
    pools), set `scheduler.max_num_seqs`, when left out, to SGLang's request pool for the
    scenario's KV pool (`max_running_requests`); returns the rule used."""
    from simulator.cost.hardware import scenario_accelerator

    eng = sc.engine
    if eng is None or eng.name != "sglang" or sc.cluster.pd is not None:
        return []
    v = parse_version(eng.version)
    if v is None or v < FIRST_MODELLED or "max_num_seqs" in sc.scheduler.model_fields_set:
        return []
    model, cache, cl = sc.model_spec(), sc.cache, sc.cluster
    if cache.num_gpu_blocks:
        tokens = cache.num_gpu_blocks * cache.block_size
    else:
        try:
            plan = sc.memory_plan(model, scenario_accelerator(sc.hardware), cl.tp, cl.pp, cl.ep)
        except ValueError:  # no plan (weights do not fit): the run says so, naming its pool
            return []
        tokens = plan.max_num_tokens
    context = sc.scheduler.max_model_len or model.max_position_embeddings
    sc.scheduler.max_num_seqs = max_running_requests(tokens, context)
    return [f"max_num_seqs {sc.scheduler.max_num_seqs}: SGLang's request pool for {tokens:,} KV "
            f"tokens at a {context:,}-token context"]
