"""vLLM's per-request chat-template work on its chat route, for `api_server.preprocess_s`.

vLLM's OpenAI server renders each `/v1/chat/completions` request's messages through the
model's Jinja chat template in the API server's event loop, synchronously, before it awaits
tokenization (`OpenAIServing._preprocess_chat`). Rendering reuses a compiled template, but two
ranges of releases also re-parsed the whole template on every request (read in the released
wheels):
- 0.6.5 to 0.9.1: `resolve_chat_template_content_format` ran `_detect_content_format` (parse
  the template, walk its AST) per request; vLLM PR #20065 cached it for 0.9.2 ("1000
  requests ... 6-8 seconds delay before prompts actually are started to process");
- 0.11.0: `apply_hf_chat_template` called `resolve_chat_template_kwargs` (a new sandboxed
  Jinja environment, parse, `find_undeclared_variables`) per request (added by vLLM PR #25794);
  0.11.1 caches it (`_cached_resolve_chat_template_kwargs`).
0.6.3.post1, 0.6.4, 0.9.2, 0.10.2 and 0.11.1 to 0.17.0 were read without it.

The seconds per request are those code paths timed on real chat templates (the
Llama-3.1-8B-Instruct, Qwen3, DeepSeek-R1 and DeepSeek-V3.1 templates, 2.1-4.6 kB):
`python bench/diagnostics/chat_template_parse.py TEMPLATE...` gave 2.3-4.6 ms for the 0.9
path and 8.0-11.2 ms for the 0.11.0 path, in two runs on this project's AMD EPYC VM
(docs/gpu-runs.md). The host CPU sets the real figure: PR #20065's server took 6-8 ms per
request on the older path.
Models served through another renderer skip it: gpt-oss (vLLM renders its Harmony format
from 0.10.1 on, `OpenAIServingChat.use_harmony`).
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from simulator.engines.scenario_model import raw_model
from simulator.engines.version import parse_version

# [first, last] release with the per-request parse, its seconds per request, and what it ran
VLLM_PER_REQUEST_PARSE = (
    (Version("0.6.5"), Version("0.9.1"), 0.004,
     "_detect_content_format parses the chat template per request (cached from 0.9.2, "
     "vLLM PR #20065)"),
    (Version("0.11.0"), Version("0.11.0"), 0.010,
     "resolve_chat_template_kwargs parses the chat template per request (vLLM PR #25794; "
     "cached from 0.11.1)"),
)
HARMONY_ARCHITECTURES = ("GptOssForCausalLM",)  # rendered by openai_harmony, not Jinja


def chat_template_rule(data: dict[str, Any], version: Any) -> list[str]:
    """`api_server.preprocess_s` for a vLLM `version` server whose clients call the chat
    route, where that version re-parses the model's chat template per request; the rule used
    (or why none applied), or nothing."""

    front = data.get("api_server") or {}
    if not isinstance(front, dict) or "preprocess_s" in front:
        return []  # (the scenario check names a bad mapping; a set value wins)
    v = parse_version(version)
    band = None if v is None else next(
        (b for b in VLLM_PER_REQUEST_PARSE if b[0] <= v <= b[1]), None)
    if band is None:
        return []
    seconds, what = band[2:]
    endpoint = front.get("endpoint")
    if endpoint is None:
        return [f"api_server.preprocess_s not charged: vLLM {v} {what}, on the chat route; "
                "set api_server.endpoint (chat_completions or completions) to say which "
                "route the clients call"]
    if endpoint != "chat_completions":
        return []
    try:
        model = raw_model(data)
    except (ValueError, OSError):  # the scenario check names what it cannot read
        return []
    if model.architecture in HARMONY_ARCHITECTURES:
        return []
    data["api_server"] = {**front, "preprocess_s": seconds}
    return [f"api_server.preprocess_s {seconds * 1e3:g} ms: vLLM {v} {what} "
            "(simulator/engines/chat_template.py)"]
