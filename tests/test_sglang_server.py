"""`engine: {name: sglang, version: V}`: SGLang's own chunked_prefill_size, mem_fraction_static
and request pool by version and GPU memory (read from its released server_args.py and
model_runner.py; the expected values are worked by hand from those rules)."""

from __future__ import annotations

import pytest

from simulator.cost.memory_plan import plan_memory
from simulator.engines.sglang_server import (
    chunked_prefill_size,
    max_running_requests,
    mem_fraction_static,
)
from simulator.engines.version import parse_version as parse
from simulator.scenario import scenario_from_dict

H100, H200, B200, A100_40, L4 = 81920, 144384, 184320, 40960, 24576  # MiB, as kvpd's catalog


@pytest.mark.parametrize("version, gpu, want", [
    ("0.4.3", H100, 8192), ("0.4.3", L4, 2048), ("0.4.3", B200, 8192),
    ("0.4.7", B200, 16384), ("0.4.7", L4, 2048), ("0.4.7", A100_40, 8192),
    ("0.5.2", A100_40, 8192), ("0.5.2", B200, 16384), ("0.5.2", 30 * 1024, 2048),
    ("0.5.3", A100_40, 4096), ("0.5.7", H200, 8192), ("0.5.7", B200, 16384),
])
def test_chunked_prefill_size_by_version_and_memory(version, gpu, want) -> None:
    assert chunked_prefill_size(parse(version), gpu) == want


@pytest.mark.parametrize("version, gpu, tp, want", [
    ("0.4.3", H100, 1, 0.88), ("0.4.3", H100, 8, 0.81), ("0.4.3", H200, 16, 0.79),
    ("0.4.6", H200, 1, (H200 - 13 * 1024) / H200),  # 0.4.6 above 80 GiB
    # 0.4.7 on H200: min(0.88 + 48 GiB x 0.12 / 141 GiB, (141 - 18) / 141) = 0.8723
    ("0.4.7", H200, 1, (H200 - 18 * 1024) / H200),
    ("0.4.7", B200, 1, 0.79),
    # 0.4.8-0.5.2: H100 TP8 reserves 9.5 + 8/2 = 13.5 GiB; B200 32 GiB
    ("0.5.2", H100, 8, round((H100 - 13.5 * 1024) / H100, 3)),
    ("0.5.2", B200, 1, round((B200 - 32 * 1024) / B200, 3)),
    # from 0.5.3: H200 TP8 reserves 512 + 1.5 x 8192 + 2 x 512 + 1024 = 14,848 MiB -> 0.897
    ("0.5.7", H200, 8, 0.897),
    # H100 TP1: 512 + 12,288 + 512 + 128 = 13,440 MiB (above the 10 GiB floor) -> 0.836
    ("0.5.7", H100, 1, round((H100 - 13440) / H100, 3)),
    # A100 40 GB TP1: 512 + 6,144 + 64 + 128 = 6,848 MiB (no floor at or below 60 GiB)
    ("0.5.7", A100_40, 1, round((A100_40 - 6848) / A100_40, 3)),
])
def test_mem_fraction_static_by_version_memory_and_parallelism(version, gpu, tp, want) -> None:
    assert mem_fraction_static(parse(version), gpu, tp, 1) == pytest.approx(want, abs=1e-12)


def test_the_request_pool_is_clamped_to_2048_4096() -> None:
    assert max_running_requests(100_000, 131072) == 2048
    assert max_running_requests(700_000, 131072) == int(700_000 / 131072 * 512)
    assert max_running_requests(5_000_000, 32768) == 4096


def test_a_static_fraction_holds_weights_and_kv() -> None:
    """mem_fraction_static f: KV pool = f x memory - weights (activations are outside f)."""
    plan = plan_memory("llama-3.1-8b", "h100-sxm", mem_fraction_static=0.85)
    assert plan.kv_pool_bytes == pytest.approx(0.85 * plan.memory_bytes - plan.weight_bytes_per_gpu,
                                               rel=1e-12)
    assert plan.activation_reserve_bytes == 0 and plan.mem_fraction_static == 0.85
    with pytest.raises(ValueError, match="mem_fraction_static=0.1 x"):
        plan_memory("llama-3.1-8b", "h100-sxm", mem_fraction_static=0.1)


def scenario(version: str | None = "0.5.7", **extra) -> dict:
    eng = {"name": "sglang", **({"version": version} if version else {})}
    return {"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": eng, **extra}


def test_a_versioned_sglang_scenario_gets_its_defaults() -> None:
    sc = scenario_from_dict(scenario())
    f = round((H100 - 13440) / H100, 3)
    assert sc.cache.mem_fraction_static == f
    assert sc.scheduler.max_num_batched_tokens == 8192 and sc.scheduler.mixed_batches is False
    plan = plan_memory("llama-3.1-8b", "h100-sxm", mem_fraction_static=f)
    assert sc.scheduler.max_num_seqs == max_running_requests(plan.max_num_tokens, 131072)
    assert sc.scheduler.max_num_seqs >= 2048  # not kvpd's 256
    assert any("SGLang 0.5.7's chunked_prefill_size" in n for n in sc.engine_notes)


def test_what_the_scenario_sets_wins_and_unknown_versions_keep_kvpds() -> None:
    sc = scenario_from_dict(scenario(scheduler={"max_num_seqs": 64, "max_num_batched_tokens": 4096},
                                     cache={"gpu_memory_utilization": 0.8}))
    assert (sc.scheduler.max_num_seqs, sc.scheduler.max_num_batched_tokens) == (64, 4096)
    assert sc.cache.mem_fraction_static is None and sc.cache.gpu_memory_utilization == 0.8
    old = scenario_from_dict(scenario("0.3.6"))
    assert old.scheduler.max_num_seqs == 256 and old.cache.mem_fraction_static is None
    assert any("predates 0.4.0" in n for n in old.engine_notes)
    bare = scenario_from_dict(scenario(None))
    assert any("version not given" in n for n in bare.engine_notes)
    # a version text with a suffix, as published ('0.5.7 (docker tag)'), reads as the version
    assert parse("0.5.7 (lmsysorg/sglang:v0.5.7-cu129-amd64)") == parse("0.5.7")
