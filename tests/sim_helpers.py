"""Small scenarios for simulator tests."""

from __future__ import annotations

import copy

from simulator.run import run_scenario
from simulator.scenario import scenario_from_dict

# a two-layer Llama config (HF dict) for scenarios that need a model but not its size
TINY_HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                  "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 512}

BASE = {
    "name": "t",
    "model": "llama-3-8b",
    "hardware": "h100-sxm",
    "output": {"plots": False},
    "workload": {
        "synthetic": {
            "num_requests": 200,
            "arrival": {"process": "poisson", "rate": 4.0},
            "prompt_len": {"dist": "uniform", "min": 64, "max": 1024},
            "output_len": {"dist": "uniform", "min": 8, "max": 256},
        }
    },
}


def merged(base: dict, patch: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        # distribution specs ("dist"/"process") replace rather than merge
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not {"dist", "process"} & set(v):
            out[k] = merged(out[k], v)
        else:
            out[k] = v
    return out


def sim(patch: dict | None = None, base: dict = BASE):
    return run_scenario(scenario_from_dict(merged(base, patch or {})), keep_requests=True)
