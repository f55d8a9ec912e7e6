"""Gated DeltaNet's chunked prefill (Qwen3-Next, Qwen3.5): kvpd's kernel pricing against the
published kernel table it was fitted to, and a whole-model prefill rate it was not fitted to.

1. `chunk_gated_delta_rule_fwd` per layer at Qwen3.5 shapes (head dims 128): vLLM PR #38981
   ("[Perf][GDN] Align TMA usage with upstream FLA", B200, vLLM's kernels) and the FLA/Triton
   column of FlashInfer PR #3866 (H100). kvpd's kernels.yaml `linear_attention` (call_s +
   tokens x (token_s + token_head_s x value heads)) is fitted to their one-sequence rows; the
   batched rows (several sequences) run faster, so kvpd's price for them is an upper bound,
   printed here as such.
2. vLLM PR #45883 (a comment of 2026-06-18, "independent perf check"): 1 x H200,
   Qwen/Qwen3.5-35B-A3B at TP1, `vllm bench serve --random-input-len L --random-output-len 1
   --num-prompts 128 --max-concurrency 128`, the second (warm, fresh prompts) run's total
   token throughput, vLLM main at g7fe7800fa with its Triton GDN backend (the kernels of 1).
   Not a suite row: the build is a development commit, not a release. kvpd simulates the
   same load with the `vllm` preset's V1 limits on a current version.

    python bench/diagnostics/linear_attention.py
"""

from __future__ import annotations

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel
from simulator.run import run_scenario
from simulator.scenario import scenario_from_dict

# part -> (source, [(value heads per rank, [tokens per sequence], ms)])
KERNEL_ROWS = {
    "b200": ("vLLM PR #38981, B200, vLLM's kernels", [
        (8, [2048], 0.193), (8, [4096], 0.259), (8, [8192], 0.384), (16, [8192], 0.474),
        (8, [1024] * 8, 0.202), (8, [2048] * 4, 0.219), (8, [4096, 4096], 0.269),
        (8, [6144, 2048], 0.326), (8, [1024, 7168], 0.351)]),
    "h100-sxm": ("FlashInfer PR #3866, H100, its FLA/Triton column", [
        (8, [2048], 0.086), (8, [4096], 0.144), (8, [8192], 0.259), (8, [16384], 0.508),
        (8, [32768], 0.997), (8, [65536], 1.954), (8, [6144, 2048], 0.221),
        (8, [4096, 4096], 0.184), (8, [2048, 6144], 0.222)]),
}
# input length -> total tokens/s, Triton GDN backend (PR #45883, run 2)
E2E_ROWS = {8192: 55264, 20480: 50819, 40960: 44964}


def kernel_table(part: str) -> list[tuple[str, float, float]]:
    """(row, measured ms, kvpd ms) of one layer's chunked prefill at the table's shapes."""
    from simulator.cost.hardware import get_accelerator
    from simulator.cost.kernels import kernel_profile

    la = kernel_profile(get_accelerator(part)).linear_attention
    out = []
    for heads, seqs, ms in KERNEL_ROWS[part][1]:
        kvpd = la.call_s + sum(seqs) * (la.token_s + la.token_head_s * heads)
        label = f"{heads:2d} heads, " + ("+".join(str(n) for n in seqs) if len(set(seqs)) > 1
                                        else f"{len(seqs)}x{seqs[0]}")
        out.append((label, ms, kvpd * 1e3))
    return out


def prefill_rate(input_len: int) -> float:
    """kvpd's total tokens/s for PR #45883's load."""
    sc = scenario_from_dict({
        "name": f"qwen3.5-35b-a3b-{input_len}", "model": "qwen3.5-35b-a3b",
        "hardware": "h200-sxm", "engine": {"name": "vllm", "version": "0.20.1"},
        "output": {"plots": False},
        "workload": {"synthetic": {"num_requests": 128, "arrival": {"process": "burst"},
                                   "prompt_len": {"dist": "fixed", "value": input_len},
                                   "output_len": {"dist": "fixed", "value": 1}},
                     "max_concurrency": 128}})
    return run_scenario(sc).summary["throughput"]["total_tokens_per_s"]


def main() -> None:
    for part, (source, _) in KERNEL_ROWS.items():
        print(f"{source}: chunk_gated_delta_rule_fwd, one layer (fitted: one-sequence rows)")
        for label, ms, kvpd in kernel_table(part):
            print(f"  {label:24s} measured {ms:6.3f} ms  kvpd {kvpd:6.3f} ms  "
                  f"{kvpd / ms - 1:+6.1%}")
    cm = CostModel("qwen3.5-35b-a3b", "h200-sxm", "bf16")
    step = cm.explain(BatchShape.from_lists([8192], [0]))
    share = next(op.time_s for op in step.ops if op.name == "linear_attn") / step.total_s
    print(f"kvpd: the linear layers' kernels are {share:.0%} of an 8192-token prefill step of "
          "Qwen3.5-35B-A3B on one H200")
    print("vLLM PR #45883, 1 x H200, Qwen3.5-35B-A3B TP1, 128 prompts at concurrency 128, "
          "1 output token (Triton GDN backend), total tok/s:")
    for n, measured in E2E_ROWS.items():
        kvpd = prefill_rate(n)
        print(f"  input {n:6d}: measured {measured:7,d}  kvpd {kvpd:9,.0f}  "
              f"{kvpd / measured - 1:+6.1%}")


if __name__ == "__main__":
    main()
