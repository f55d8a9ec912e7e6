"""Memory plan of a replica: weights + activation reserve + KV pool -> KV blocks."""

from __future__ import annotations

import pytest

from simulator.cost.hardware import GIB, get_accelerator
from simulator.cost.memory_plan import plan_memory
from simulator.cost.models import get_model


def test_llama3_70b_does_not_fit_one_80gb_gpu_and_says_by_how_much() -> None:
    """Issue 4: Llama-3-70B at bf16 (141.1 GB of weights) on one 80 GB H100."""
    with pytest.raises(ValueError) as exc:
        plan_memory("llama-3-70b", "h100-sxm", "bf16", tp=1, pp=1, block_size=16)
    msg = str(exc.value)
    budget = 0.9 * 80 * GIB
    shortfall = (get_model("llama-3-70b").weight_bytes("bf16") - budget) / 1e9
    for part in ("llama-3-70b", "h100-sxm", "tp=1", "pp=1", "bf16", f"short by {shortfall:.1f} GB"):
        assert part in msg


def test_tensor_and_pipeline_parallel_split_the_weights() -> None:
    one = plan_memory("llama-3-8b", "h100-sxm", tp=1, block_size=16)
    two = plan_memory("llama-3-8b", "h100-sxm", tp=2, block_size=16)
    pp2 = plan_memory("llama-3-8b", "h100-sxm", pp=2, block_size=16)
    w = get_model("llama-3-8b").weight_bytes("bf16")
    assert one.weight_bytes_per_gpu == pytest.approx(w)
    assert w / 2 <= two.weight_bytes_per_gpu < 0.51 * w
    assert w / 2 <= pp2.weight_bytes_per_gpu < 0.52 * w
    # each GPU holds half the KV heads (TP) or half the layers (PP) of a block
    assert two.kv_bytes_per_block == one.kv_bytes_per_block / 2 == pp2.kv_bytes_per_block
    assert two.num_gpu_blocks > 2 * one.num_gpu_blocks  # more room and smaller blocks
    fits = plan_memory("llama-3-70b", "h100-sxm", tp=2, block_size=16)
    assert fits.num_gpu_blocks > 0


def test_block_count_is_pool_over_block_bytes() -> None:
    plan = plan_memory("llama-3-8b", "h100-sxm", "bf16", tp=1, pp=1, block_size=16,
                       gpu_memory_utilization=0.9, activation_reserve_bytes=2e9)
    model = get_model("llama-3-8b")
    pool = 0.9 * 80 * GIB - model.weight_bytes("bf16") - 2e9
    assert plan.kv_pool_bytes == pytest.approx(pool)
    assert plan.kv_bytes_per_block == 16 * model.kv_bytes_per_token("bf16")
    assert plan.num_gpu_blocks == int(pool // plan.kv_bytes_per_block)
    assert plan.max_num_tokens == plan.num_gpu_blocks * 16


def test_more_memory_or_a_smaller_kv_dtype_gives_more_blocks() -> None:
    base = plan_memory("llama-3-8b", "h100-sxm", block_size=16)
    assert plan_memory("llama-3-8b", "h100-sxm", block_size=16,
                       gpu_memory_utilization=0.95).num_gpu_blocks > base.num_gpu_blocks
    assert plan_memory("llama-3-8b", "h200-sxm", block_size=16).num_gpu_blocks > base.num_gpu_blocks
    fp8 = plan_memory("llama-3-8b", "h100-sxm", block_size=16, kv_cache_dtype="fp8")
    assert fp8.num_gpu_blocks == pytest.approx(2 * base.num_gpu_blocks, abs=1)
    # tokens, not blocks, are what the block size must not change (up to rounding)
    b32 = plan_memory("llama-3-8b", "h100-sxm", block_size=32)
    assert abs(b32.max_num_tokens - base.max_num_tokens) <= 32


def test_hypothetical_bigger_gpu_makes_70b_fit() -> None:
    big = get_accelerator({"base": "h100-sxm", "memory_gib": 192})
    assert plan_memory("llama-3-70b", big, block_size=16).num_gpu_blocks > 0


def test_no_room_for_kv_is_an_error_too() -> None:
    with pytest.raises(ValueError, match=r"no room for the KV cache: llama-3-8b .* on l4"):
        plan_memory("llama-3-8b", "l4", block_size=16, activation_reserve_bytes=7.2e9)


@pytest.mark.parametrize("kwargs, message", [
    ({"block_size": 0}, "block_size"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"activation_reserve_bytes": -1}, "activation_reserve_bytes"),
    ({"tp": 3}, "tp=3 does not divide"),
])
def test_bad_plan_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_memory("llama-3-8b", "h100-sxm", **{"block_size": 16, **kwargs})


def test_tensorrt_llm_sizing_gives_the_kv_a_share_of_what_is_left() -> None:
    """free_gpu_memory_fraction F (TensorRT-LLM's KvCacheConfig): KV pool = F x (memory -
    weights - activation reserve), gpu_memory_utilization unused; weights may use all memory."""
    from simulator.cost.memory_plan import plan_memory

    vllm = plan_memory("llama-3.3-70b", "h100-sxm", "fp8", tp=2, kv_cache_dtype="fp8")
    trt = plan_memory("llama-3.3-70b", "h100-sxm", "fp8", tp=2, kv_cache_dtype="fp8",
                      free_gpu_memory_fraction=0.9, gpu_memory_utilization=0.5)
    left = trt.memory_bytes - trt.weight_bytes_per_gpu - trt.activation_reserve_bytes
    assert trt.kv_pool_bytes == pytest.approx(0.9 * left, rel=1e-12)
    assert vllm.kv_pool_bytes == pytest.approx(
        0.9 * vllm.memory_bytes - vllm.weight_bytes_per_gpu - vllm.activation_reserve_bytes, rel=1e-12)
    assert trt.num_gpu_blocks == int(trt.kv_pool_bytes // trt.kv_bytes_per_block)
    assert trt.to_dict()["free_gpu_memory_fraction"] == 0.9
    # 70B FP8 on one H100 (72.7 GB of weights, 3.2 GB of reserve): vLLM's rule leaves 0.9 x
    # 85.9 GB - 75.8 GB = 1.5 GB of KV, TensorRT-LLM's 0.9 x (85.9 GB - 75.8 GB) = 9.1 GB
    tight = plan_memory("llama-3.3-70b", "h100-sxm", "fp8", kv_cache_dtype="fp8")
    one = plan_memory("llama-3.3-70b", "h100-sxm", "fp8", kv_cache_dtype="fp8",
                      free_gpu_memory_fraction=0.9)
    assert 1.4e9 < tight.kv_pool_bytes < 1.6e9 and 9.0e9 < one.kv_pool_bytes < 9.1e9
    with pytest.raises(ValueError, match=r"free_gpu_memory_fraction must be in \(0, 1\]"):
        plan_memory("llama-3.1-8b", "h100-sxm", free_gpu_memory_fraction=1.5)


def test_a_scenario_gives_one_memory_rule() -> None:
    from simulator.scenario import scenario_from_dict

    base = {"model": "llama-3.1-8b", "hardware": "h100-sxm"}
    sc = scenario_from_dict({**base, "cache": {"free_gpu_memory_fraction": 0.8}})
    assert sc.cache.free_gpu_memory_fraction == 0.8
    with pytest.raises(ValueError, match="give one of gpu_memory_utilization, "
                                         "free_gpu_memory_fraction: gpu_memory_utilization is "
                                         "vLLM's share"):
        scenario_from_dict({**base, "cache": {"free_gpu_memory_fraction": 0.8,
                                              "gpu_memory_utilization": 0.9}}, "s.yaml")
