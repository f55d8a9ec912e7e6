"""vLLM's Triton unified attention (the TRITON_ATTN backend) at prefill: the K/V re-read rate
kvpd prices it at (kernels.yaml `triton_attn.reread_bandwidth`).

The kernel (vllm/attention/ops/triton_unified_attention.py, v0.10.1 to v0.13.0) runs one
program per block of BLOCK_Q query tokens and KV head, BLOCK_Q = BLOCK_M / (query heads per
KV head), BLOCK_M = 16 for up to 16 query heads per KV head. Each program walks the K/V
prefix up to its own diagonal (causal tiles skipped since vLLM PR #20308, 2025-07-07), so a
prompt's K/V is read once per query block: pairs x KV bytes per token / BLOCK_Q, against
FlashAttention's once. With 16-row tiles that traffic, not the tensor cores, bounds it.

The one public end-to-end time of this kernel at a long prompt: vLLM PR #20690 (2025-07-09,
after #20308), "current upstream using the triton_attn backend", H100, Llama-3.1-8B-Instruct,
`benchmark_latency.py --input-len 10000 --output-len 4 --batch-size 1`: 0.6648 s. Less kvpd's
own time for everything but prefill attention (the rest of the prefill step and three decode
steps), the rest is the kernel; with FlashAttention's compute time overlapped as kvpd overlaps
any operator, the re-read bytes over that time give the rate as a multiple of HBM bandwidth.

    python bench/diagnostics/triton_attention.py
"""

from __future__ import annotations

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.dtypes import dtype_bytes
from simulator.cost.kernels import triton_block_q

MEASURED_S = 0.6647519522656997  # vLLM PR #20690, upstream triton_attn, H100, 10000 in / 4 out
PROMPT, OUTPUTS = 10000, 4


def reread_bandwidth(part: str = "h100-sxm", model: str = "llama-3.1-8b") -> dict[str, float]:
    """The implied re-read rate (x the part's bandwidth) and the pieces it comes from."""
    cm = CostModel(model, part, "bf16")
    step = explain_step(cm, BatchShape.from_lists([PROMPT], [0]))
    attn = next(op for op in step.ops if op.name == "attn_prefill")
    rest = step.total_s - attn.time_s
    decodes = sum(cm.step_time(BatchShape.from_lists([1], [PROMPT + i]))
                  for i in range(OUTPUTS - 1))
    kernel_s = MEASURED_S - rest - decodes
    ov = 1.0 - cm.params.overlap
    reread_s = kernel_s - ov * attn.compute_s  # kvpd's max(c, m) + ov x min(c, m), m > c
    m = cm.model
    pairs = PROMPT * (PROMPT + 1) / 2
    kv_token = 2 * m.num_kv_heads * m.head_dim * dtype_bytes("bf16")
    nbytes = m.num_layers * pairs * kv_token / triton_block_q(m.num_heads, m.num_kv_heads)
    return {"rest_s": rest, "decodes_s": decodes, "kernel_s": kernel_s,
            "flash_attn_s": attn.time_s, "reread_bytes": nbytes,
            "reread_bandwidth": nbytes / reread_s / cm.accelerator.mem_bw_bytes_per_s}


def main() -> None:
    r = reread_bandwidth()
    print("vLLM PR #20690: H100, Llama-3.1-8B, 10000-token prompt + 3 decodes, triton_attn: "
          f"{MEASURED_S:.4f} s measured")
    print(f"  kvpd, all but prefill attention: {r['rest_s']:.4f} s prefill step + "
          f"{r['decodes_s']:.4f} s decodes")
    print(f"  -> Triton prefill attention {r['kernel_s']:.4f} s (kvpd's FlashAttention: "
          f"{r['flash_attn_s']:.4f} s)")
    print(f"  K/V re-read {r['reread_bytes'] / 1e12:.3f} TB -> "
          f"{r['reread_bandwidth']:.3f} x the H100's HBM bandwidth "
          "(kernels.yaml triton_attn.reread_bandwidth)")


if __name__ == "__main__":
    main()
