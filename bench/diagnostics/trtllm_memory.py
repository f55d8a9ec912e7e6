"""TensorRT-LLM's KV pool against kvpd's memory plan, from a run log that prints its memory.

TensorRT-LLM's C++ runtime (the engines before its PyTorch backend) logs what it allocates
before the KV cache: the engine (weights), the TensorRT execution context (activations for
max_num_tokens), "runtime buffers" and "decoder" buffers, then the memory still free, of which
the KV cache takes `free_gpu_memory_fraction`. kvpd's plan takes weights and an analytical
activation reserve (`memory_plan.default_activation_reserve`: the widest live tensors of a
max_num_batched_tokens step, fp32 logits of 256 sequences and 1 GiB outside the allocator) and
gives the KV cache the same fraction of the rest.

The table below is the suite's own trtllm-bench source (bench/published/
etched_trtllm_llama31_70b_h100.yaml): every one of its 16 runs logs the same figures. The
runtime and decoder buffers grow with max_batch_size (2048, trtllm-bench's) and the vocabulary;
kvpd has no term for them yet. To run the published rows on the logged pool:
`python bench/published.py --source etched-trtllm-llama31-70b-h100 --set cache.num_gpu_blocks=42668`.

    python bench/diagnostics/trtllm_memory.py
"""

from __future__ import annotations

from simulator.cost.memory_plan import plan_memory

GIB, MIB, GB = 2**30, 2**20, 1e9

# shaamil101-etched/trtllm-benchmarks results/result_128_8192_750.txt (commit aeec9f29): TensorRT-LLM
# 0.16.0, Llama-3.1-70B-Instruct FP8 (FP8 KV cache), TP8 on 8 x H100 80GB, max batch 2048,
# max tokens 8192, max sequence 25000, KV memory percentage 90%
LOG = {
    "engine": 8925 * MIB,  # "Loaded engine size: 8925 MiB" (rank 0; 8925-8941 MiB over the ranks)
    "execution context": 1013.01 * MIB,  # "Allocated 1013.01 MiB for execution context memory"
    "runtime buffers": 1.63 * GB,  # "Allocated 1.63 GB GPU memory for runtime buffers"
    "decoder": 3.30 * GB,  # "Allocated 3.30 GB GPU memory for decoder"
    "total": 79.10 * GIB,  # "Memory usage when calculating max tokens in paged kv cache: total: 79.10 GiB"
    "available": 57.87 * GIB,  # "... available: 57.87 GiB" (the leader rank; 61.38-61.64 on the others)
    "kv": 52.08 * GIB,  # "Allocated 52.08 GiB for max tokens in paged KV cache (2730752)"
    "kv_tokens": 2730752,
}


def main() -> None:
    plan = plan_memory("llama-3.1-70b", "h100-sxm", "fp8", tp=8, block_size=64,
                       kv_cache_dtype="fp8", free_gpu_memory_fraction=0.9,
                       max_num_batched_tokens=8192)
    other = LOG["total"] - LOG["available"] - sum(
        LOG[k] for k in ("engine", "execution context", "runtime buffers", "decoder"))
    print("TensorRT-LLM 0.16.0, Llama-3.1-70B FP8 TP8 on H100 80GB (trtllm-bench, max batch 2048)")
    print(f"  {'':34s}{'logged GiB':>12s}{'kvpd GiB':>10s}")
    rows = [
        ("GPU memory", LOG["total"], plan.memory_bytes),
        ("weights (engine)", LOG["engine"], plan.weight_bytes_per_gpu),
        ("activations (execution context)", LOG["execution context"], None),
        ("runtime buffers", LOG["runtime buffers"], None),
        ("decoder buffers", LOG["decoder"], None),
        ("everything else (CUDA, NCCL, MPI)", other, None),
        ("kvpd's activation reserve", None, plan.activation_reserve_bytes),
        ("KV cache", LOG["kv"], plan.kv_pool_bytes),
    ]
    for label, logged, ours in rows:
        a = f"{logged / GIB:12.2f}" if logged is not None else f"{'':12s}"
        b = f"{ours / GIB:10.2f}" if ours is not None else ""
        print(f"  {label:34s}{a}{b}")
    kvpd_tokens = plan.num_gpu_blocks * plan.block_size
    print(f"  KV tokens: logged {LOG['kv_tokens']:,}, kvpd {kvpd_tokens:,} "
          f"({kvpd_tokens / LOG['kv_tokens']:.2f}x)")


if __name__ == "__main__":
    main()
