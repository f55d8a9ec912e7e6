"""The serving engines' documented behaviour, for the scenario key `engine:` (`apply_engine`
fills every key a scenario leaves out and says which rule it used).

- `presets`: the rules per engine and version (admission, limits, all-reduce, KV dtype,
  attention kernel, prefix caching) and `apply_engine`.
- `version`: engine version strings read leniently.
- `sglang_server`: SGLang's chunked prefill size, memory fraction and request limit.
- `trtllm_bench`: `trtllm-bench throughput`'s own batch and token limits.
- `vllm_fused_moe`: whether vLLM runs a tuned fused-MoE config or its pre-v0.17 fallback.
"""

from simulator.engines.presets import ENGINES, ENTRY_POINTS, apply_engine

__all__ = ["ENGINES", "ENTRY_POINTS", "apply_engine"]
