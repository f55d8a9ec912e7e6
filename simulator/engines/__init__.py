"""The serving engines' documented behaviour, for the scenario key `engine:` (`apply_engine`
fills every key a scenario leaves out and says which rule it used).

- `presets`: the rules per engine and version (admission, limits, all-reduce, KV dtype,
  attention kernel, prefix caching) and `apply_engine`.
- `version`: engine version strings read leniently.
- `sglang_server`: SGLang's chunked prefill size, memory fraction and request limit.
- `trtllm_bench`: `trtllm-bench throughput`'s own batch and token limits.
- `fused_moe_fallback`: whether vLLM or SGLang runs a tuned fused-MoE config or the old
  fallback.
- `chat_template`: the vLLM releases that re-parse the chat template per chat request.
"""

from simulator.engines.presets import ENGINES, ENTRY_POINTS, apply_engine

__all__ = ["ENGINES", "ENTRY_POINTS", "apply_engine"]
