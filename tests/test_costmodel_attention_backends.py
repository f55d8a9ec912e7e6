"""`cluster.attention_backend`: vLLM's Triton unified attention (`triton_attn`: its prefill
re-reads the K/V prefix once per block of BLOCK_Q query tokens, kernels.yaml `triton_attn`) and
its one FlashAttention-2 call per step (`flash_attn_2`: decodes beside prompt tokens are not
GQA-packed); the vLLM preset picks each where vLLM does, and what neither can price is refused
by name."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from simulator.cluster.cluster import plan_pool
from simulator.core.batch_shape import BatchShape
from simulator.cost.breakdown import explain_step
from simulator.cost.costmodel import CostModel
from simulator.cost.dtypes import dtype_bytes
from simulator.cost.kernels import kernel_profile, triton_block_q
from simulator.cost.models import get_model
from simulator.scenario import PoolSpec, scenario_from_dict

GPT_OSS = {"dtype": "fp4", "quantization": {"method": "mxfp4", "scope": "experts"}}


@pytest.mark.parametrize("heads, kv_heads, want", [
    (32, 8, 4),  # Llama-3-8B: BLOCK_M 16 over 4 query heads per KV head
    (64, 8, 2),  # gpt-oss
    (32, 32, 16),  # MHA
    (24, 8, 5),  # 3 per KV head: 16 // 3
    (64, 2, 1),  # 32 per KV head: BLOCK_M 32
    (40, 2, 1),  # 20 per KV head: BLOCK_M 32 // 20
])
def test_block_q_is_the_launchers_block_m_over_the_query_group(heads, kv_heads, want):
    assert triton_block_q(heads, kv_heads) == want


def _models(model: str = "llama-3.1-8b", part: str = "a100-80gb-sxm", **kw):
    return (CostModel(model, part, **kw), CostModel(model, part, attention_backend="triton_attn",
                                                   **kw))


@pytest.mark.parametrize("new, before", [(10000, 0), (2048, 30000), (512, 0), (16, 4096)])
def test_prefill_attention_streams_the_reread_bytes_at_the_catalog_rate(new, before):
    flash, triton = _models()
    shape = BatchShape.from_lists([new], [before])
    op = next(o for o in explain_step(triton, shape).ops if o.name == "attn_prefill")
    m = triton.model
    pairs = new * before + new * (new + 1) / 2
    kv_token = 2 * m.num_kv_heads * m.head_dim * dtype_bytes("bf16")
    reread = m.num_layers * pairs * kv_token / 4  # 4 query tokens per block (GQA 4)
    acc = triton.accelerator
    assert op.memory_s >= reread / (acc.mem_bw_bytes_per_s
                                    * kernel_profile(acc).triton_reread_bandwidth) * (1 - 1e-12)
    assert "triton_attn.reread_bandwidth" in op.source or op.bound == "compute"
    # everything but prefill attention is priced the same; the fast path agrees with explain
    assert triton.step_time(shape) == pytest.approx(explain_step(triton, shape).total_s, rel=1e-12)
    rest = [(o.name, o.time_s) for o in explain_step(flash, shape).ops if o.name != "attn_prefill"]
    assert rest == [(o.name, o.time_s) for o in explain_step(triton, shape).ops
                    if o.name != "attn_prefill"]
    if new >= 2048:  # long prompts: the re-reads bound the step, well above FlashAttention
        assert op.bound == "memory"
        assert triton.step_time(shape) > 1.5 * flash.step_time(shape)


def test_decode_steps_and_the_window_are_the_flash_pricing_plus_nothing():
    flash, triton = _models("gpt-oss-20b", **GPT_OSS)
    decode = BatchShape.from_lists([1] * 32, [3000] * 32, window=128)
    assert triton.step_time(decode) == flash.step_time(decode)
    # sliding layers read at most their window: a long prompt's re-reads grow with the
    # full-attention layers only (half of gpt-oss's)
    mixed = BatchShape.from_lists([2048], [20000], window=128)
    full = BatchShape.from_lists([2048], [20000])
    assert triton.step_time(mixed) < triton.step_time(full)


def test_the_catalog_rate_is_the_one_its_source_gives():
    """kernels.yaml's hopper triton_attn.reread_bandwidth is what the diagnostic derives from
    vLLM PR #20690's measured time (bench/diagnostics/triton_attention.py)."""
    path = pathlib.Path(__file__).parents[1] / "bench" / "diagnostics" / "triton_attention.py"
    spec = importlib.util.spec_from_file_location("triton_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    got = mod.reread_bandwidth()["reread_bandwidth"]
    from simulator.cost.hardware import get_accelerator
    assert kernel_profile(get_accelerator("h100-sxm")).triton_reread_bandwidth == pytest.approx(
        got, abs=0.01)


def test_what_it_cannot_price_is_refused_by_name():
    with pytest.raises(ValueError, match="multi-head latent attention"):
        CostModel("deepseek-v2-lite", "a100-80gb-sxm", attention_backend="triton_attn")
    with pytest.raises(ValueError, match=r"no figure for mi300x .*reread_bandwidth"):
        CostModel("llama-3.1-8b", "mi300x", attention_backend="triton_attn")
    for part in ("cpu", "m3-max"):  # parts without any kernel profile
        with pytest.raises(ValueError, match=rf"no figure for {part} \(no kernel profile\)"):
            CostModel("llama-3-8b", part, attention_backend="triton_attn")
    with pytest.raises(ValueError, match="unknown; allowed: flash_attn, flash_attn_2, triton_attn"):
        CostModel("llama-3.1-8b", "a100-80gb-sxm", attention_backend="flex")
    sc = scenario_from_dict({"model": "llama-3.1-8b", "hardware": "mi300x",
                             "cluster": {"attention_backend": "triton_attn"}}, "s.yaml")
    with pytest.raises(ValueError, match=r"colocated pool: cluster.attention_backend: .*mi300x"):
        plan_pool(sc, get_model("llama-3.1-8b"), PoolSpec(), "colocated")


def _vllm(model: str, hardware: str, version: str | None, **data):
    engine = {"name": "vllm", **({"version": version} if version else {})}
    extra = GPT_OSS if model.startswith("gpt-oss") else {}
    return scenario_from_dict({"model": model, "hardware": hardware, "engine": engine,
                               **extra, **data}, "s.yaml")


@pytest.mark.parametrize("model, hardware, version, cache, want", [
    ("gpt-oss-20b", "a100-80gb-sxm", "0.11.0", {}, "triton_attn"),  # sinks, Ampere
    ("gpt-oss-20b", "l40s", "0.13.0", {}, "triton_attn"),  # sinks, Ada
    ("gpt-oss-20b", "a100-80gb-sxm", None, {}, "triton_attn"),  # current vLLM does it too
    ("gpt-oss-20b", "h100-sxm", "0.11.0", {}, "flash_attn"),  # FA3 runs sinks on Hopper
    ("gpt-oss-20b", "b200", "0.11.0", {}, "flash_attn"),  # FlashInfer on Blackwell
    ("llama-3.1-8b", "a100-80gb-sxm", "0.11.0", {}, "flash_attn_2"),  # V1 on FA2
    ("llama-3.1-8b", "a10", None, {}, "flash_attn_2"),
    ("llama-3.1-8b", "rtx-pro-6000", None, {}, "flash_attn_2"),  # sm_120: FA2, not FA3
    ("gpt-oss-20b", "rtx-pro-6000", "0.11.0", {}, "triton_attn"),  # sinks, sm_120
    ("llama-3.1-8b", "a100-80gb-sxm", "0.7.3", {}, "flash_attn"),  # V0: decodes on their own
    ("llama-3.1-8b", "h100-sxm", "0.11.0", {}, "flash_attn"),  # FA3
    ("deepseek-v2-lite", "a100-80gb-sxm", "0.11.0", {}, "flash_attn"),  # MLA backends
    ("llama-3.1-8b", "a100-80gb-sxm", "0.11.0", {"kv_cache_dtype": "fp8"}, "triton_attn"),
    ("llama-3.1-8b", "a100-80gb-sxm", "0.12.0", {"kv_cache_dtype": "fp8"}, "flash_attn"),
    ("llama-3.1-8b", "a100-80gb-sxm", "0.10.1", {"kv_cache_dtype": "fp8"}, "flash_attn"),
])
def test_the_vllm_preset_picks_the_kernel_vllm_picks(model, hardware, version, cache, want):
    sc = _vllm(model, hardware, version, cache=cache)
    assert sc.cluster.attention_backend == want
    assert any(f"attention_backend {want}" in n for n in sc.engine_notes) == (want != "flash_attn")


def test_a_backend_the_scenario_names_wins_and_other_engines_keep_flash():
    sc = _vllm("gpt-oss-20b", "a100-80gb-sxm", "0.11.0",
               cluster={"attention_backend": "flash_attn"})
    assert sc.cluster.attention_backend == "flash_attn"
    sc = scenario_from_dict({"model": "gpt-oss-20b", "hardware": "a100-80gb-sxm", **GPT_OSS,
                             "engine": {"name": "sglang", "version": "0.5.6"}}, "s.yaml")
    assert sc.cluster.attention_backend == "flash_attn"


def test_kvpd_estimate_prices_and_names_the_backend(capsys):
    from kvpd.cli import main

    argv = ["estimate", "--model", "gpt-oss-20b", "--hardware", "a100-80gb-sxm", "--dtype", "fp4",
            "--quantization", "mxfp4", "--quantization-scope", "experts", "--prefill", "8192"]
    assert main(argv + ["--json"]) == 0
    flash = json.loads(capsys.readouterr().out)
    assert main(argv + ["--json", "--attention-backend", "triton_attn"]) == 0
    triton = json.loads(capsys.readouterr().out)
    assert triton["attention_backend"] == "triton_attn" and flash["attention_backend"] == "flash_attn"
    assert triton["step_time_s"] > 1.3 * flash["step_time_s"]  # 1.42x at 8k tokens
    assert main(argv + ["--attention-backend", "triton_attn", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "vLLM's Triton attention" in out and "triton_attn.reread_bandwidth" in out
    assert main(["estimate", "--model", "llama-3.1-8b", "--hardware", "mi300x", "--prefill", "64",
                 "--attention-backend", "triton_attn"]) == 2
    assert "no figure for mi300x" in capsys.readouterr().err


@pytest.mark.parametrize("model, group", [("qwen3-14b", 5), ("llama-3.1-8b", 4), ("qwen3-32b", 8)])
def test_flash_attn_2_reads_a_decodes_kv_once_per_query_head_beside_prompt_tokens(model, group):
    """vLLM's one FlashAttention-2 call per step: a decode beside prompt tokens is not
    GQA-packed (its K/V read once per query head); a pure-decode step is, as with flash_attn;
    prompt attention and every other operator are priced the same."""
    flash, fa2 = (CostModel(model, "a100-80gb-sxm", attention_backend=b)
                  for b in ("flash_attn", "flash_attn_2"))
    mixed = BatchShape.from_lists([1] * 40 + [1500], [4000] * 40 + [2000])
    decode = BatchShape.from_lists([1] * 40, [4000] * 40)
    assert fa2.step_time(decode) == flash.step_time(decode)
    ops = {b: {o.name: o for o in explain_step(cm, mixed).ops} for b, cm in
           (("flash", flash), ("fa2", fa2))}
    m = fa2.model
    kv_token = m.num_layers * 2 * m.num_kv_heads * m.head_dim * dtype_bytes("bf16")
    extra = (group - 1) * 40 * 4001 * kv_token  # contexts include the new token
    assert ops["fa2"]["attn_decode"].bytes - ops["flash"]["attn_decode"].bytes == pytest.approx(
        extra, rel=1e-3)
    assert "once per query head" in ops["fa2"]["attn_decode"].source
    for name, op in ops["flash"].items():
        if name != "attn_decode":
            assert ops["fa2"][name].time_s == op.time_s
    assert fa2.step_time(mixed) == pytest.approx(explain_step(fa2, mixed).total_s, rel=1e-12)
    assert fa2.step_time(mixed) > flash.step_time(mixed)


def test_flash_attn_2_never_packs_a_model_whose_every_layer_slides():
    """FlashAttention-2 swaps a GQA group onto one K/V read only without a window
    (flash_api.cpp: window_size_left < 0), so for Mistral-7B (every layer slides) each decode
    reads its K/V once per query head in every step, pure decode included; the all-decode
    fast paths agree with explain."""
    flash, fa2 = (CostModel("mistral-7b", "a100-80gb-sxm", attention_backend=b)
                  for b in ("flash_attn", "flash_attn_2"))
    m = fa2.model
    assert m.num_sliding_layers == m.num_layers and m.num_heads // m.num_kv_heads == 4
    decode = BatchShape.from_lists([1] * 32, [3000] * 32, window=m.sliding_window)
    ops = {b: {o.name: o for o in explain_step(cm, decode).ops} for b, cm in
           (("flash", flash), ("fa2", fa2))}
    kv_token = m.num_layers * 2 * m.num_kv_heads * m.head_dim * dtype_bytes("bf16")
    assert ops["fa2"]["attn_decode"].bytes - ops["flash"]["attn_decode"].bytes == pytest.approx(
        3 * 32 * 3001 * kv_token, rel=1e-3)
    assert "with a sliding window" in ops["fa2"]["attn_decode"].source
    t = fa2.step_time(decode)
    assert t == pytest.approx(explain_step(fa2, decode).total_s, rel=1e-12)
    assert fa2.decode_step_time(decode) == pytest.approx(t, rel=1e-12)
    assert float(fa2.decode_run_times(decode, 2)[0]) == pytest.approx(t, rel=1e-12)
    assert t > 1.5 * flash.step_time(decode)


def test_pd_pools_get_the_kernel_of_their_own_part():
    """A PD scenario's pools may sit on different parts: the vLLM preset picks each pool's
    kernel from its own hardware, and each pool's cost model prices it."""
    pd = {"prefill": {"hardware": "h100-sxm"}, "decode": {}}  # decode on the scenario's A100
    sc = _vllm("llama-3.1-8b", "a100-80gb-sxm", "0.11.0", cluster={"pd": pd})
    assert sc.cluster.attention_backend == "flash_attn"
    assert sc.cluster.pd.prefill.attention_backend is None
    assert sc.cluster.pd.decode.attention_backend == "flash_attn_2"
    assert any(n.startswith("cluster.pd.decode.attention_backend flash_attn_2")
               for n in sc.engine_notes)
    model = get_model("llama-3.1-8b")
    assert plan_pool(sc, model, sc.cluster.pd.prefill, "prefill").cost_model.attention_backend == (
        "flash_attn")
    assert plan_pool(sc, model, sc.cluster.pd.decode, "decode").cost_model.attention_backend == (
        "flash_attn_2")
    # the scenario's own cluster-wide key wins over the preset in every pool
    sc = _vllm("llama-3.1-8b", "a100-80gb-sxm", "0.11.0",
               cluster={"pd": {"prefill": {}, "decode": {}}, "attention_backend": "flash_attn"})
    assert sc.cluster.pd.decode.attention_backend is None
    # a pool's own key that its part cannot price is refused naming that key
    sc = scenario_from_dict({"model": "llama-3.1-8b", "hardware": "a100-80gb-sxm", "cluster": {
        "pd": {"decode": {"hardware": "mi300x", "attention_backend": "triton_attn"}}}}, "s.yaml")
    with pytest.raises(ValueError, match=r"decode pool: cluster.pd.decode.attention_backend"):
        plan_pool(sc, model, sc.cluster.pd.decode, "decode")
