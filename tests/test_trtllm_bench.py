"""`engine: {name: tensorrt-llm, entry_point: offline}` stands for `trtllm-bench throughput`,
which sizes max_batch_size and max_num_tokens from the dataset and the GPU memory when they
are not given (TensorRT-LLM bench/build/tuning.py). The expected values here are worked by
hand from that rule, not from kvpd's code."""

from __future__ import annotations

import copy

import pytest

from simulator.cost.models import get_model
from simulator.engines.trtllm_bench import bench_limits, kv_requests, round_batch, round_tokens
from simulator.scenario import scenario_from_dict

GiB = 2**30


def scenario(**over) -> dict:
    base = {
        "model": "llama-3.1-8b", "dtype": "fp8", "hardware": "h100-sxm",
        "engine": {"name": "tensorrt-llm", "version": "0.21.0", "entry_point": "offline"},
        "workload": {"synthetic": {
            "num_requests": 200, "arrival": {"process": "burst"},
            "prompt_len": {"dist": "fixed", "value": 128},
            "output_len": {"dist": "fixed", "value": 128}}},
    }
    for key, value in over.items():
        cur = base
        *path, last = key.split("__")
        for p in path:
            cur = cur.setdefault(p, {})
        cur[last] = value
    return base


@pytest.mark.parametrize("raw, want", [(1, 64), (40, 64), (65, 96), (255.5, 256), (256, 256),
                                       (300, 384), (1023, 1024), (1024, 1024), (1025, 1280),
                                       (4096, 4096)])
def test_batch_rounding(raw, want) -> None:
    assert round_batch(raw) == want


@pytest.mark.parametrize("raw, want", [(10, 2048), (2049, 2304), (4095, 4096), (4096, 4096),
                                       (4097, 4608), (8191, 8192), (8192, 8192), (8193, 9216),
                                       (32768, 32768)])
def test_token_rounding(raw, want) -> None:
    assert round_tokens(raw) == want


def test_llama_8b_fp8_on_one_h100_at_128_128() -> None:
    """KV per token: 2 x 32 layers x 8 heads x 128 x 1 byte (FP8 KV) = 64 KiB; weights 8.03 GB
    at 1 byte; 0.9 x (80 GiB - weights) / (64 KiB x 256 tokens) = 4,177 requests, capped at
    4096; tokens 4096 x (1 + 128/128) = 8192; no chunking: max(8192, 128 + 4096)."""
    m = get_model("llama-3.1-8b")
    want = 0.9 * (80 * GiB - m.num_params) / (2 * 32 * 8 * 128 * 256)
    got = kv_requests(m, 80.0, 1, 1, 1.0, 1.0, 128, 128)
    assert got == pytest.approx(want, rel=1e-12)
    assert 4100 < got < 4300
    assert bench_limits(m, 80.0, 1, 1, "fp8", "fp8", "fp8", 128, 128, 128)[:2] == (4096, 8192)


def test_a_kv_limited_run_rounds_the_batch_and_sizes_the_tokens() -> None:
    """Llama-3.1-70B BF16 on 4 x 80 GiB at 2048/2048: 0.9 x (343.6 GB - 141.1 GB) / (2 x 80
    x max(4, 8) x 128 x 2 bytes x 4096 = 1.342 GB) = 135.8 requests -> 160 (up to 32);
    tokens 160 x 2 = 320 -> the 2048 floor, then max(2048, 2048 + 160) = 2208 without
    chunked prefill."""
    m = get_model("llama-3.1-70b")
    reqs = 0.9 * (320 * GiB - 2 * m.num_params) / (2 * 80 * 8 * 128 * 2 * 4096)
    assert 135 < reqs < 136
    batch, tokens, how = bench_limits(m, 80.0, 4, 1, "bf16", None, "bf16", 2048, 2048, 2048)
    assert batch == 160 and tokens == 2048 + 160
    assert f"{reqs:.0f} requests" in how
    # with chunked prefill the longest prompt no longer sets the floor
    assert bench_limits(m, 80.0, 4, 1, "bf16", None, "bf16", 2048, 2048, 2048,
                        chunked_prefill=True)[:2] == (160, 2048)


def test_mla_models_are_sized_by_their_config_heads_not_the_latent() -> None:
    """DeepSeek-V3's config says 128 KV heads and no head_dim: the rule takes 7168 / 128 = 56
    per head, whatever the latent cache really holds."""
    m = get_model("deepseek-v3")
    got = kv_requests(m, 141.0, 8, 1, 1.0, 1.0, 1000, 1000)
    want = 0.9 * (8 * 141 * GiB - m.num_params) / (2 * 61 * 128 * 56 * 2000)
    assert got == pytest.approx(want, rel=1e-12)


def test_quantizations_the_tool_does_not_tune_get_the_build_defaults() -> None:
    m = get_model("llama-3.1-8b")
    batch, tokens, how = bench_limits(m, 80.0, 1, 1, "int4", "awq", "fp16", 3000, 100, 9000)
    assert (batch, tokens) == (2048, 9000 + 2048)
    assert "build defaults" in how


def test_no_room_for_one_request_is_refused() -> None:
    with pytest.raises(ValueError, match="no room for one request"):
        bench_limits(get_model("llama-3.1-70b"), 80.0, 1, 1, "bf16", None, "bf16", 100, 100, 100)


def test_an_offline_tensorrt_llm_scenario_gets_the_tool_s_limits() -> None:
    sc = scenario_from_dict(scenario())
    assert (sc.scheduler.max_num_seqs, sc.scheduler.max_num_batched_tokens) == (4096, 8192)
    assert sc.scheduler.enable_chunked_prefill is False
    assert any("trtllm-bench throughput's heuristic" in n for n in sc.engine_notes)


def test_the_workload_s_own_lengths_size_the_limits() -> None:
    """Uniform prompts 1000..3000 (mean ~2000, longest <= 3000), 500 out, on 70B BF16 TP4."""
    data = scenario(model="llama-3.1-70b", dtype="bf16", cluster={"tp": 4})
    data["workload"]["synthetic"]["prompt_len"] = {"dist": "uniform", "min": 1000, "max": 3000}
    data["workload"]["synthetic"]["output_len"] = {"dist": "fixed", "value": 500}
    sc = scenario_from_dict(data)
    from simulator.run import build_trace

    trace = build_trace(sc)
    m = get_model("llama-3.1-70b")
    batch, tokens, _ = bench_limits(m, 80.0, 4, 1, "bf16", None, "bf16",
                                    trace.prompt_len.mean(), 500, int(trace.prompt_len.max()))
    assert (sc.scheduler.max_num_seqs, sc.scheduler.max_num_batched_tokens) == (batch, tokens)
    assert tokens >= int(trace.prompt_len.max()) + batch


def test_what_the_scenario_sets_wins_and_other_entry_points_are_untouched() -> None:
    sc = scenario_from_dict(scenario(scheduler={"max_num_seqs": 512}))
    assert (sc.scheduler.max_num_seqs, sc.scheduler.max_num_batched_tokens) == (512, 8192)
    both = scenario_from_dict(scenario(scheduler={"max_num_seqs": 8, "max_num_batched_tokens": 4096}))
    assert (both.scheduler.max_num_seqs, both.scheduler.max_num_batched_tokens) == (8, 4096)
    server = copy.deepcopy(scenario())
    server["engine"]["entry_point"] = "server"
    sc = scenario_from_dict(server)  # trtllm-serve: BuildConfig's 2048 / 8192
    assert (sc.scheduler.max_num_seqs, sc.scheduler.max_num_batched_tokens) == (2048, 8192)
    assert not any("trtllm-bench" in n for n in sc.engine_notes)
    vllm = scenario(engine={"name": "vllm", "version": "0.11.0", "entry_point": "offline"})
    assert not any("trtllm-bench" in n for n in scenario_from_dict(vllm).engine_notes)
