"""Shared helpers for the realexec tests: tiny seeded models and HF `generate` references."""

from __future__ import annotations

import functools
import random

import pytest
import torch

from realexec.engine.hf_reference import hf_greedy
from realexec.engine.model_loader import load_model

FAMILIES = ["tiny-llama", "tiny-gemma", "tiny-helium", "tiny-arcee", "tiny-glm", "tiny-nemotron",
            "tiny-starcoder2", "tiny-stablelm", "tiny-cohere", "tiny-cohere2", "tiny-phi",
            "tiny-olmo", "tiny-gpt-neox", "tiny-gpt-neox-sequential",
            "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-seed-oss",
            "tiny-smollm3", "tiny-granite", "tiny-glm4", "tiny-hunyuan", "tiny-ernie4.5",
            "tiny-olmo2", "tiny-olmo3", "tiny-exaone4", "tiny-gpt2", "tiny-opt", "tiny-opt-350m",
            "tiny-mistral-sw", "tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe",
            "tiny-deepseek-v3", "tiny-deepseek-v32", "tiny-glm5", "tiny-glm4-moe",
            "tiny-minimax-m2", "tiny-olmoe", "tiny-flex-olmo", "tiny-phimoe", "tiny-granitemoe",
            "tiny-granitemoe-shared", "tiny-hunyuan-moe", "tiny-ernie4.5-moe", "tiny-dots1",
            "tiny-glm4-moe-lite", "tiny-exaone-moe", "tiny-llama4", "tiny-gpt-oss", "tiny-gemma2", "tiny-gemma3",
            "tiny-phi3", "tiny-qwen3-next", "tiny-qwen3.5", "tiny-qwen3.5-moe", "tiny-qwen3.5-mm",
            "tiny-nemotron-h", "tiny-nemotron-h-latent", "tiny-granite4-h",
            "tiny-granite4-h-dense"]
# Gated DeltaNet or Mamba-2 layers: a state per request, no KV
LINEAR_FAMILIES = ["tiny-qwen3-next", "tiny-qwen3.5", "tiny-qwen3.5-moe", "tiny-qwen3.5-mm",
                   "tiny-nemotron-h", "tiny-nemotron-h-latent", "tiny-granite4-h",
                   "tiny-granite4-h-dense"]
VOCAB = 256  # vocab_size of the tiny configs (realexec.engine.configs.TINY)


@functools.lru_cache(maxsize=8)
def hf_model(name: str):
    """The same seeded random model `LLM(name, seed=0)` builds, as a plain HF module."""
    return load_model(name, dtype="fp32", device="cpu", seed=0).model


@functools.lru_cache(maxsize=4096)
def _reference(name: str, prompt: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    return tuple(hf_greedy(hf_model(name), list(prompt), max_tokens))


def reference(name: str, prompt: list[int], max_tokens: int) -> list[int]:
    """HF's own greedy `generate` for one prompt (stops at the model's EOS like ours)."""
    return list(_reference(name, tuple(prompt), max_tokens))


def random_prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in lengths]


def assert_pool_whole(llm) -> None:
    """After a generate, every device and host block is free again."""
    kvm = llm.kv_cache_manager
    assert kvm.num_free_blocks == kvm.num_gpu_blocks
    assert len(kvm.free_cpu_blocks) == kvm.num_cpu_blocks
    assert not llm.has_unfinished_requests()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine a
    2-thread OpenMP team stalls whenever another process takes a core; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
