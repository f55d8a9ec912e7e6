"""kvpd's routed-expert time per MoE layer against published `fused_moe` kernel benchmarks
(vLLM's `benchmarks/kernels/benchmark_moe.py`, SGLang's `tuning_fused_moe_triton.py`: the
whole `fused_experts` call, i.e. moe_align_block_size, the two grouped GEMMs, the activation
and the sum, for M tokens on one GPU at the model's TP shard).

kvpd's side is the `moe_experts` op of an all-decode step of M requests (`explain_step`) per
MoE layer, plus the call's fixed time (`grouped_gemm.call_s`; without it the layer floor's
share of those five kernels, `layer_floor.kernel_s` x 5).

    python bench/diagnostics/moe_kernels.py

Every row names its source. The NVIDIA tables are the ones `grouped_gemm.stream_efficiency` and
`call_s` were fitted to. AMD's own CK kernels (aiter's tuned fused-MoE tables) set the CDNA
entries: cdna3's `stream_efficiency` and `call_s` from the MI300X rows up to 512 tokens, and
each CDNA arch's `relative` (the compute-bound rate) from its rows from `COMPUTE_BOUND_M` tokens
on (`fit_relative`). Read with care: the A100-PCIe part is priced as the catalog's a100-40gb-sxm
(same 1,555 GB/s HBM).
"""

from __future__ import annotations

import math
import statistics

from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.hardware import get_accelerator
from simulator.cost.kernels import FUSED_EXPERTS_KERNELS, kernel_profile

# (label, model, hardware, tp, dtype, {M tokens: measured us}, source)
ROWS = [
    ("Mixtral-8x7B bf16, H100 80GB HBM3, TP2 (E=8 N=7168, tuned)", "mixtral-8x7b", "h100-sxm", 2,
     "bf16", {1: 144.03, 2: 229.28, 4: 351.10, 8: 434.98, 16: 471.49, 32: 487.35, 64: 483.14,
              128: 491.39, 256: 536.77}, "vLLM PR #24700 (tuned config column)"),
    ("DeepSeek-V2-Lite shape bf16, A100-SXM4-80GB (E=64 N=1408 top-6, tuned)", "deepseek-v2-lite",
     "a100-80gb-sxm", 1, "bf16", {1: 183.5, 4: 266.2, 16: 523.3, 64: 677.6, 256: 717.0,
                                  1024: 929.9}, "vLLM PR #40542 (tuned column)"),
    ("Qwen3-30B-A3B bf16, A100-PCIE-40GB (E=128 N=768, default config)", "qwen3-30b-a3b",
     "a100-40gb-sxm", 1, "bf16", {1: 109.21, 2: 159.81, 4: 268.89, 8: 403.13, 16: 611.19,
                                  32: 808.53, 64: 917.45}, "SGLang PR #6825 (before the PR)"),
    ("Qwen3-30B-A3B fp8 w8a8, H100 80GB HBM3, TP1 (E=128 N=768, PR defaults)", "qwen3-30b-a3b",
     "h100-sxm", 1, "fp8", {1: 40.44, 2: 56.15, 4: 78.10, 8: 118.64, 16: 164.64, 32: 210.07,
                            64: 237.26, 128: 247.67, 256: 262.38, 512: 286.24},
     "vLLM PR #24700 (Qwen3 MoE FP8, the PR's column)"),
    ("Qwen3-235B-A22B fp8 w8a8, H200, TP8 (E=128 N=192, default config)", "qwen3-235b-a22b",
     "h200-sxm", 8, "fp8", {1: 31.70, 2: 36.56, 4: 49.67, 8: 66.87, 16: 92.36, 32: 124.99},
     "SGLang PR #11730 (without the tuned kernel)"),
    ("Qwen3-235B-A22B bf16, MI300X, TP4 (E=128 N=384, aiter CK 2-stage, tuned)", "qwen3-235b-a22b",
     "mi300x", 4, "bf16", {1: 34.06, 2: 52.66, 4: 84.43, 8: 147.94, 16: 218.24, 32: 302.34,
                           64: 338.29, 128: 351.88, 256: 356.61, 512: 412.15, 1024: 525.16,
                           2048: 719.66, 4096: 1277.81, 8192: 2220.84, 16384: 4216.91,
                           32768: 7767.44},
     "ROCm/aiter e4048607a5 aiter/configs/model_configs/qwen3_235b_bf16_tuned_fmoe.csv, "
     "cu_num 304, inter_dim 384, column us"),
    ("Qwen3-235B-A22B bf16, MI300X, TP8 (E=128 N=192, aiter CK 2-stage, tuned)", "qwen3-235b-a22b",
     "mi300x", 8, "bf16", {1: 32.71, 2: 43.87, 4: 53.37, 8: 82.86, 16: 116.72, 32: 154.69,
                           64: 171.60, 128: 181.89, 256: 194.35, 512: 234.85, 1024: 300.73,
                           2048: 475.13, 4096: 810.57, 8192: 1497.06, 16384: 2874.94,
                           32768: 5610.76},
     "ROCm/aiter e4048607a5 aiter/configs/model_configs/qwen3_235b_bf16_tuned_fmoe.csv, "
     "cu_num 304, inter_dim 192, column us"),
    ("Qwen3-235B-A22B bf16, MI355X, TP4 (E=128 N=384, aiter CK 2-stage, tuned)", "qwen3-235b-a22b",
     "mi355x", 4, "bf16", {1: 34.90, 2: 44.94, 4: 55.21, 8: 92.50, 16: 140.70, 32: 196.10,
                           64: 211.06, 128: 214.75, 256: 220.75, 512: 234.71, 1024: 292.03,
                           2048: 424.92, 4096: 657.42, 8192: 1190.52, 16384: 2245.70,
                           32768: 4061.06},
     "ROCm/aiter e4048607a5 aiter/configs/model_configs/qwen3_235b_bf16_tuned_fmoe.csv, "
     "cu_num 256 (gfx950), inter_dim 384, column us"),
    # a check, not fitted: the shared expert runs inside AMD's call as a 257th expert (top-9);
    # kvpd's moe_experts op holds it as a dense GEMM (and the 3 dense layers' MLPs, spread over
    # the 58 MoE layers here: ~1 us per layer at decode, ~2% at 8,192 tokens)
    ("DeepSeek-V3 fp8 block-scale, MI355X, TP4 (E=256+1 shared, N=512, aiter CK 2-stage, tuned)",
     "deepseek-v3", "mi355x", 4, "fp8", {1: 56.84, 2: 62.72, 4: 78.65, 8: 128.17, 16: 211.27,
                                          32: 328.35, 64: 418.70, 128: 472.00, 256: 515.70,
                                          512: 540.50, 1024: 673.68, 2048: 873.59,
                                          4096: 1294.01, 8192: 2305.85},
     "ROCm/aiter e4048607a5 aiter/configs/model_configs/a8w8_blockscale_tuned_fmoe_ds_v3.csv, "
     "cu_num 256 (gfx950), inter_dim 512, column us (its inter_dim 256 rows repeat one time "
     "from 1,024 tokens on and are left out)"),
    # a check of an engine era, not fitted: vLLM's block-FP8 fused MoE of February 2025 on H100
    # (the Triton kernel, and the first DeepGEMM integration). kvpd (a current kernel's rates;
    # its moe_experts also holds the shared expert, which benchmark_moe leaves out) comes out
    # 0.2-0.6x these times. These Triton columns ran vLLM's fallback config: vLLM 0.7.3 ships
    # no tuned E=256 block-FP8 file for the H100 at N=256 (TP8) or N=2048 (TP1). They do not
    # price the dstack H200 rows: 0.7.3 ships the tuned H200 N=256 file, byte for byte the
    # one vLLM 0.9.1 still ships (read in both wheels)
    ("DeepSeek-V3 fp8 block-scale, H100, TP1 (E=256 N=4096, Triton, Feb 2025)", "deepseek-v3",
     "h100-sxm", 1, "fp8", {512: 13017.54, 1024: 13322.31, 1536: 13777.98, 2048: 19839.38},
     "vLLM PR #13932 (H100 results, Triton column, TP1)"),
    ("DeepSeek-V3 fp8 block-scale, H100, TP1 (E=256 N=4096, DeepGEMM, Feb 2025)", "deepseek-v3",
     "h100-sxm", 1, "fp8", {512: 7017.80, 1024: 7850.04, 1536: 8691.74, 2048: 9545.87},
     "vLLM PR #13932 (H100 results, DeepGEMM column, TP1)"),
    ("DeepSeek-V3 fp8 block-scale, H100, TP8 (E=256 N=512, Triton, Feb 2025)", "deepseek-v3",
     "h100-sxm", 8, "fp8", {512: 1810.36, 1024: 1892.75, 1536: 1988.70, 2048: 2818.65},
     "vLLM PR #13932 (H100 results, Triton column, TP8)"),
    ("DeepSeek-V3 fp8 block-scale, H100, TP8 (E=256 N=512, DeepGEMM, Feb 2025)", "deepseek-v3",
     "h100-sxm", 8, "fp8", {512: 2331.06, 1024: 2886.08, 1536: 3423.49, 2048: 3974.65},
     "vLLM PR #13932 (H100 results, DeepGEMM column, TP8)"),
    # Blackwell's grouped_gemm entries are assumed as Hopper's (kernels.yaml). SGLang's tuned
    # Triton config on the B200 at DeepSeek-R1 TP8 (the 'Before' column of the PR that made
    # flashinfer_trtllm SGLang's MoE runner for block-FP8 DeepSeek on SM100 by default): kvpd is
    # 24-28% fast at 1-4 tokens (the call's fixed time on Blackwell is larger than Hopper's) and
    # within 9% from 8 on. Only a check: SGLang runs these shapes on flashinfer_trtllm since.
    ("DeepSeek-R1 fp8 block-scale, B200, TP8 (E=256 N=256, SGLang's tuned Triton config, "
     "Oct 2025)", "deepseek-v3", "b200", 8, "fp8",
     {1: 52.65, 2: 60.35, 4: 79.09, 8: 95.47, 16: 138.68, 24: 175.80},
     "SGLang PR #11816 (the 'Before' column: Triton)"),
]
# vLLM's fallback config before v0.17 (no tuned file for the shape: BLOCK_SIZE_M 16 while the
# tokens are at most the experts, else 64; BLOCK_SIZE_K 32; no num_warps / num_stages), priced
# with `fused_moe_config="legacy_default"`. vLLM 0.11.0 ships no E=128,N=768 H100 fp8_w8a8
# file (read in the wheel), so PR #24700's "Main" column ran that fallback; its hopper
# `legacy_default.relative` is fitted to these rows from COMPUTE_BOUND_M tokens on
# (`fit_legacy_relative`).
LEGACY_ROWS = [
    ("Qwen3-30B-A3B fp8 w8a8 per-tensor, H100 80GB HBM3, TP1 (E=128 N=768, vLLM's fallback "
     "config, Sept 2025)", "qwen3-30b-a3b", "h100-sxm", 1, "fp8",
     {1: 44.54, 2: 59.94, 4: 90.46, 8: 129.77, 16: 185.40, 24: 215.99, 32: 238.37, 48: 257.83,
      64: 262.73, 96: 270.98, 128: 273.72, 256: 355.49, 512: 391.86, 1024: 536.33,
      1536: 727.31, 2048: 911.64, 3072: 1279.17, 4096: 1647.57},
     "vLLM PR #24700 (Qwen3 MoE FP8, the 'Main' column)"),
    # The same fallback on the B200 (vLLM 0.13 era; no E=128,N=768 B200 file then), whose
    # Blackwell legacy_default is assumed as Hopper's: a check, not in the Hopper fit
    ("Qwen3-Omni-30B-A3B bf16, B200, TP1 (E=128 N=768, vLLM's fallback config, Dec 2025)",
     "qwen3-30b-a3b", "b200", 1, "bf16", {1: 39.61, 2: 51.87, 4: 73.18},
     "vLLM PR #31448 (the 'with default config' column)"),
]
# From this many tokens on the fused experts are compute-bound in every table above: the CDNA
# grouped_gemm `relative` (kernels.yaml) is fitted to these rows of AMD's own tables
COMPUTE_BOUND_M = 2048


def kvpd_us(cm: CostModel, m: int) -> float:
    """kvpd's routed-expert microseconds per MoE layer for an all-decode step of `m` requests."""
    shape = BatchShape.from_lists([1] * m, [64] * m)
    ops = {op.name: op for op in explain_step(cm, shape).ops}
    layers = cm.model.num_moe_layers
    call = FUSED_EXPERTS_KERNELS * cm.kernels.kernel_s + cm.kernels.moe_call_extra_s()
    return (ops["moe_experts"].time_s / layers + call) * 1e6


def fit_relative(part: str) -> tuple[float, list[float]]:
    """The `grouped_gemm.relative` of `part`'s arch that makes kvpd's compute-bound expert time
    match its BF16 tables (the rows of `part` from COMPUTE_BOUND_M tokens on) in geometric mean:
    the catalog's value x that mean of kvpd / measured (the time there is the grouped GEMM's
    compute, inversely proportional to `relative`), and those ratios at the catalog value."""
    ratios = []
    for _, model, hw, tp, dtype, measured, _ in ROWS:
        if hw != part or dtype != "bf16":  # (relative is the BF16 kernel's; fp8_speedup scales it)
            continue
        cm = CostModel(model, hw, dtype, tp=tp)
        ratios += [kvpd_us(cm, m) / us for m, us in measured.items() if m >= COMPUTE_BOUND_M]
    relative = kernel_profile(get_accelerator(part)).grouped_gemm.relative
    return relative * math.exp(statistics.fmean(math.log(r) for r in ratios)), ratios


# Between these token counts the fallback's experts stream their weights (memory-bound in
# kvpd, with the fixed per-call time a small part): its `legacy_default.stream_efficiency` is
# fitted to these rows
STREAM_BOUND_M = (16, 128)


def fit_legacy(part: str = "h100-sxm") -> tuple[float, float, list[float]]:
    """The `grouped_gemm.legacy_default` `relative` and `stream_efficiency` of `part`'s arch
    that make kvpd's expert time under vLLM's fallback config match LEGACY_ROWS in geometric
    mean (compute from COMPUTE_BOUND_M tokens on, streaming within STREAM_BOUND_M; each time
    inversely proportional to its term), and the ratios kvpd / measured at the catalog values."""
    compute, stream = [], []
    for _, model, hw, tp, dtype, measured, _ in LEGACY_ROWS:
        if hw != part:
            continue
        cm = CostModel(model, hw, dtype, tp=tp, fused_moe_config="legacy_default")
        for m, us in measured.items():
            r = kvpd_us(cm, m) / us
            if m >= COMPUTE_BOUND_M:
                compute.append(r)
            elif STREAM_BOUND_M[0] <= m <= STREAM_BOUND_M[1]:
                stream.append(r)
    g = kernel_profile(get_accelerator(part)).grouped_gemm.legacy_default

    def gmean(xs: list[float]) -> float:
        return math.exp(statistics.fmean(math.log(x) for x in xs))

    return g.relative * gmean(compute), g.stream_efficiency * gmean(stream), compute + stream


def main() -> None:
    for label, model, hw, tp, dtype, measured, source in ROWS + LEGACY_ROWS:
        legacy = (label, model, hw, tp, dtype, measured, source) in LEGACY_ROWS
        cm = CostModel(model, hw, dtype, tp=tp,
                       fused_moe_config="legacy_default" if legacy else "tuned")
        print(f"{label}\n  source: {source}")
        print(f"  {'M':>5s} {'measured us':>12s} {'kvpd us':>9s} {'kvpd/meas':>10s}")
        for m, us in measured.items():
            got = kvpd_us(cm, m)
            print(f"  {m:5d} {us:12.1f} {got:9.1f} {got / us:10.2f}")
    for part in ("mi300x", "mi355x"):
        rel, ratios = fit_relative(part)
        print(f"{part}: from {COMPUTE_BOUND_M} tokens on, kvpd / measured "
              f"{min(ratios):.2f}-{max(ratios):.2f} (geometric mean "
              f"{math.exp(statistics.fmean(math.log(r) for r in ratios)):.3f}): the fitted "
              f"grouped_gemm.relative is {rel:.3f}")
    rel, stream, ratios = fit_legacy()
    print(f"hopper, vLLM's fallback config: kvpd / measured {min(ratios):.2f}-{max(ratios):.2f} "
          f"at the catalog values; fitted grouped_gemm.legacy_default.relative {rel:.3f} "
          f"(from {COMPUTE_BOUND_M} tokens on), stream_efficiency {stream:.3f} "
          f"({STREAM_BOUND_M[0]}-{STREAM_BOUND_M[1]} tokens)")


if __name__ == "__main__":
    main()
