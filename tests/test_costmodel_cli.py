"""`kvpd estimate`, `kvpd hardware`, `kvpd model` through the CLI entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvpd.cli import main
from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_estimate_json_matches_the_cost_model(capsys) -> None:
    rc, out, _ = run_cli(capsys, "estimate", "--model", "llama-3-8b", "--hardware", "h100-sxm",
                         "--decode", "64x2048", "--json")
    assert rc == 0
    data = json.loads(out)
    shape = BatchShape.from_lists([1] * 64, [2048] * 64)
    assert data["step_time_s"] == pytest.approx(CostModel("llama-3-8b", "h100-sxm").step_time(shape))
    assert data["bound"] == "memory" and data["num_tokens"] == 64
    assert data["decode_tokens_per_s"] == pytest.approx(64 / data["step_time_s"])
    assert {op["name"] for op in data["ops"]} >= {"qkv_proj", "attn_decode", "mlp", "lm_head"}
    assert data["memory_plan"]["num_gpu_blocks"] > 0 and data["fits_kv_pool"]


def test_estimate_text_mixed_step_with_tp(capsys) -> None:
    rc, out, _ = run_cli(capsys, "estimate", "--model", "llama-3-70b", "--hardware", "h100-sxm",
                         "--tp", "4", "--dtype", "bf16", "--prefill", "512", "--decode", "32x1024")
    assert rc == 0
    for text in ("step time", "tokens/s", "bound", "tp_allreduce", "attn_prefill", "attn_decode"):
        assert text in out


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama-3-8", "--hardware", "h100-sxm", "--prefill", "10"], "did you mean"),
    (["--model", "llama-3-8b", "--hardware", "h100-sxmm", "--prefill", "10"], "h100-sxm"),
    (["--model", "llama-3-8b", "--hardware", "h100-sxm", "--tp", "3", "--prefill", "10"],
     "tp=3 does not divide num_heads=32"),
    (["--model", "llama-3-70b", "--hardware", "h100-sxm", "--decode", "1x10"], "short by"),
    (["--model", "llama-3-8b", "--hardware", "h100-sxm", "--decode", "2048"], "expected BxC"),
    (["--model", "llama-3-8b", "--hardware", "h100-sxm"], "--prefill N, --decode BxC"),
    (["--model", "llama-3-8b", "--hardware", "h100-sxm", "--prefill", "10",
      "--prefill-graph-max-tokens", "-1"], "--prefill-graph-max-tokens must be >= 0"),
    (["--model", "llama-3-8b", "--hardware", "h100-sxm", "--prefill", "10",
      "--fused-moe-config", "legacy_default"], "llama-3-8b is a dense model"),
    (["--model", "mixtral-8x7b", "--hardware", "m3-max", "--prefill", "10",
      "--fused-moe-config", "legacy_default"], "m3-max has no fallback-config entry (it has no "
     "kernel tables"),
])
def test_estimate_bad_input_exits_2_with_the_reason(capsys, argv: list[str], message: str) -> None:
    rc, _, err = run_cli(capsys, "estimate", *argv)
    assert rc == 2 and message in err


def test_estimate_accepts_a_hypothetical_accelerator_inline(capsys) -> None:
    args = ["estimate", "--model", "llama-3-8b", "--decode", "1x1000", "--json", "--hardware"]
    _, out, _ = run_cli(capsys, *args, "h100-sxm")
    _, fast_out, _ = run_cli(capsys, *args, "{base: h100-sxm, mem_bw_tbps_scale: 2}")
    base, fast = json.loads(out), json.loads(fast_out)
    assert fast["hardware"] == "h100-sxm-custom"
    assert fast["step_time_s"] < base["step_time_s"]
    rc, _, err = run_cli(capsys, *args, "{base: h100-sxm, hbm: 2}")
    assert rc == 2 and "unknown field(s) ['hbm']" in err


def test_hardware_list_and_show(capsys) -> None:
    rc, out, _ = run_cli(capsys, "hardware", "list")
    assert rc == 0 and "h100-sxm" in out and "nvlink4" in out and "placeholder" in out
    rc, out, _ = run_cli(capsys, "hardware", "show", "h100-sxm", "--json")
    data = json.loads(out)
    assert rc == 0 and data["name"] == "h100-sxm" and data["links"]["scale_up_link"]["name"] == "nvlink4"
    rc, out, _ = run_cli(capsys, "hardware", "show", "ib-ndr")
    assert rc == 0 and "50.0" in out
    rc, _, err = run_cli(capsys, "hardware", "show", "tpu-v9")
    assert rc == 2 and "unknown hardware" in err


def test_model_list_and_show_a_config_json(capsys, tmp_path) -> None:
    rc, out, _ = run_cli(capsys, "model", "list")
    assert rc == 0 and "mixtral-8x7b" in out and "2/8" in out
    cfg = {"architectures": ["GPT2LMHeadModel"], "n_layer": 12, "n_embd": 768, "n_head": 12,
           "vocab_size": 50257, "n_positions": 1024}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc, out, _ = run_cli(capsys, "model", "show", str(tmp_path), "--json")
    assert rc == 0 and json.loads(out)["num_params"] == 124_439_808
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"architectures": ["BertModel"]}))
    rc, _, err = run_cli(capsys, "model", "show", str(bad))
    assert rc == 2 and "supported: LlamaForCausalLM" in err


def test_estimate_counts_a_sliding_window_request_s_blocks_as_the_core_does():
    """A prefill step writes all its tokens before any block can slide out; a decode step
    holds the window's blocks plus one token's (kv_cache_manager.blocks_held)."""
    from kvpd.commands.estimate import kv_tokens_held
    from simulator.core.kv_cache_manager import blocks_held
    from simulator.cost.models import get_model

    held = kv_tokens_held(get_model("mistral-7b"), 16)  # every layer slides, window 4096
    assert held(8192, 8192) == 8192
    assert held(16001, 1) == blocks_held(16001, 16, 4096, 1) * 16 == (256 + 1) * 16
    assert held(100, 1) == 100
    assert kv_tokens_held(get_model("llama-3-8b"), 16)(16001, 1) == 16001


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """`kvpd model list | head -1`: the pipe closes before kvpd has written; kvpd stops
    quietly with 141 (128 + SIGPIPE) instead of printing a BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "kvpd.cli", "model", "list"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_estimate_sizes_the_kv_as_tensorrt_llm_on_request(capsys) -> None:
    """--free-gpu-memory-fraction: the plan's KV pool is that share of what the weights and
    activation reserve leave; it cannot be given with --gpu-memory-utilization."""
    args = ("estimate", "--model", "llama-3.3-70b", "--hardware", "h100-sxm", "--dtype", "fp8",
            "--decode", "8x1024", "--json")
    rc, out, _ = run_cli(capsys, *args, "--free-gpu-memory-fraction", "0.9")
    plan = json.loads(out)["memory_plan"]
    assert rc == 0 and plan["free_gpu_memory_fraction"] == 0.9
    left = plan["memory_bytes"] - plan["weight_bytes_per_gpu"] - plan["activation_reserve_bytes"]
    assert plan["kv_pool_bytes"] == pytest.approx(0.9 * left, rel=1e-12)
    with pytest.raises(SystemExit):
        main([*args, "--free-gpu-memory-fraction", "0.9", "--gpu-memory-utilization", "0.8"])
    # SGLang's static fraction: weights + KV = F x memory
    rc, out, _ = run_cli(capsys, *args, "--mem-fraction-static", "0.85")
    plan = json.loads(out)["memory_plan"]
    assert plan["kv_pool_bytes"] == pytest.approx(
        0.85 * plan["memory_bytes"] - plan["weight_bytes_per_gpu"], rel=1e-12)
    with pytest.raises(SystemExit):
        main([*args, "--mem-fraction-static", "0.85", "--free-gpu-memory-fraction", "0.9"])


def test_estimate_prices_a_prompt_step_outside_cuda_graphs(capsys) -> None:
    base = ["estimate", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--prefill", "512",
            "--json"]
    graphed = json.loads(run_cli(capsys, *base)[1])
    eager = json.loads(run_cli(capsys, *base, "--prefill-graph-max-tokens", "256")[1])
    within = json.loads(run_cli(capsys, *base, "--prefill-graph-max-tokens", "512")[1])
    ops = {op["name"]: op for op in eager["ops"]}
    assert eager["step_time_s"] == pytest.approx(graphed["step_time_s"]
                                                 + ops["eager_dispatch"]["time_s"])
    assert within["step_time_s"] == graphed["step_time_s"]
    assert "eager_dispatch" not in {op["name"] for op in within["ops"]}


def test_a_mixed_window_model_says_how_its_kv_plan_differs(capsys) -> None:
    """gpt-oss and Gemma 3 mix sliding and full layers: the estimate says the plan keeps the
    whole context on every layer and how many more tokens per-type KV groups would hold;
    models whose layers all slide, or none, get no such line."""
    from simulator.cost.memory_plan import mixed_window_note
    from simulator.cost.models import get_model

    rc, out, _ = run_cli(capsys, "estimate", "--model", "gemma-3-27b", "--hardware", "h100-sxm",
                         "--decode", "8x8000", "--json")
    note = json.loads(out)["kv_plan_note"]
    assert rc == 0 and "52 of 62 layers" in note and "6.2x" in note
    assert "18 of 36 layers" in mixed_window_note(get_model("gpt-oss-120b"))
    assert "2.0x" in mixed_window_note(get_model("gpt-oss-120b"))
    for name in ("mistral-7b", "llama-3-8b", "phi-4-mini"):
        assert mixed_window_note(get_model(name)) is None
    rc, out, _ = run_cli(capsys, "estimate", "--model", "llama-3-8b", "--hardware", "h100-sxm",
                         "--decode", "8x1000")
    assert "KV plan" not in out


def test_hybrid_kv_cache_counts_only_the_window_on_the_sliding_layers(capsys) -> None:
    """`--hybrid-kv-cache` (vLLM V1's hybrid KV cache manager): blocks of one group's 18
    layers, twice as many; each decode of 4,101 tokens holds its full-attention group's 257
    blocks and its sliding group's cdiv(128, 16) + 1 = 9, in tokens of the pool's blocks."""
    argv = ("estimate", "--model", "gpt-oss-120b", "--hardware", "a100-80gb-sxm", "--dtype",
            "fp4", "--quantization", "mxfp4", "--quantization-scope", "experts", "--decode",
            "20x4100", "--json")
    _, out, _ = run_cli(capsys, *argv)
    one = json.loads(out)
    rc, out, _ = run_cli(capsys, *argv, "--hybrid-kv-cache")
    grouped = json.loads(out)
    assert rc == 0 and grouped["memory_plan"]["sliding_groups"] == 1
    assert grouped["memory_plan"]["num_gpu_blocks"] >= 2 * one["memory_plan"]["num_gpu_blocks"]
    assert one["kv_tokens_needed"] == 20 * 4101
    assert grouped["kv_tokens_needed"] == 20 * (257 + 9) * 16
    assert "hybrid KV cache manager, a KV block holds one group" in grouped["kv_plan_note"]


def test_model_show_says_how_the_queries_attend(capsys) -> None:
    expect = {"gemma-3-27b": "a 1,024-token sliding window on 52 of 62 layers",
              "deepseek-v3.2": "sparse: each query attends to its top 2,048 keys",
              "deepseek-v3": "MLA (latent 512 + rope 64 cached)",
              "llama-3-8b": "GQA (4 query heads per KV head)", "gpt2": "MHA"}
    for name, text in expect.items():
        rc, out, _ = run_cli(capsys, "model", "show", name, "--json")
        assert rc == 0 and text in json.loads(out)["attention"], name


def test_model_show_gives_vllms_kv_cache_groups(capsys) -> None:
    rc, out, _ = run_cli(capsys, "model", "show", "gemma-3-27b")
    assert rc == 0 and ("under vLLM V1: 1 full-attention and 6 sliding-window group(s) of 10 "
                        "layers") in out
    rc, out, _ = run_cli(capsys, "model", "show", "gpt-oss-20b", "--json")
    assert json.loads(out)["kv_cache_groups"] == {"layers_per_group": 12, "sliding_groups": 1}
    rc, out, _ = run_cli(capsys, "model", "show", "llama-3-8b", "--json")
    assert json.loads(out)["kv_cache_groups"] is None


def _scenario(tmp_path, **keys) -> str:
    """A scenario file with a small synthetic load and `keys` laid over it."""
    import yaml

    data = {"model": "llama-3-8b", "hardware": "a100-80gb-sxm",
            "workload": {"synthetic": {"num_requests": 4, "arrival": {"process": "burst"},
                                       "prompt_len": {"dist": "fixed", "value": 64},
                                       "output_len": {"dist": "fixed", "value": 8}}}}
    data.update(keys)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_estimate_a_scenario_prices_its_engines_rules_as_simulate_does(capsys, tmp_path) -> None:
    """`--scenario` prices the replica `kvpd simulate` builds: vLLM 0.11.0 on an A100 runs its
    FlashAttention-2 varlen call and charges its scheduler's host time per request, as the
    flags say when given by hand, and the JSON names the scenario and the engine's rules."""
    path = _scenario(tmp_path, engine={"name": "vllm", "version": "0.11.0"})
    rc, out, _ = run_cli(capsys, "estimate", "--scenario", path, "--prefill", "256",
                         "--decode", "16x512", "--json")
    assert rc == 0
    got = json.loads(out)
    rc, out, _ = run_cli(capsys, "estimate", "--model", "llama-3-8b", "--hardware",
                         "a100-80gb-sxm", "--attention-backend", "flash_attn_2",
                         "--host-request-s", "5.5e-6", "--prefill", "256", "--decode", "16x512",
                         "--json")
    by_hand = json.loads(out)
    assert got["step_time_s"] == pytest.approx(by_hand["step_time_s"], rel=1e-12)
    rc, out, _ = run_cli(capsys, "estimate", "--model", "llama-3-8b", "--hardware",
                         "a100-80gb-sxm", "--prefill", "256", "--decode", "16x512", "--json")
    assert json.loads(out)["step_time_s"] < got["step_time_s"]  # the rules cost something
    assert got["scenario"] == "scenario s, colocated pool"
    assert any("host_request_s" in n for n in got["engine_notes"])
    assert any("flash_attn_2" in n for n in got["engine_notes"])


def test_estimate_a_scenario_takes_set_and_picks_a_pd_pool(capsys, tmp_path) -> None:
    path = _scenario(tmp_path, cluster={"pd": {"prefill": {"tp": 2}, "decode": {"tp": 1}}})
    rc, _, err = run_cli(capsys, "estimate", "--scenario", path, "--decode", "8x100")
    assert rc == 2 and "give --pool prefill or --pool decode" in err
    rc, out, _ = run_cli(capsys, "estimate", "--scenario", path, "--pool", "prefill",
                         "--prefill", "512")
    assert rc == 0 and "prefill pool" in out and "(tp=2, pp=1)" in out
    path = _scenario(tmp_path)
    rc, out, _ = run_cli(capsys, "estimate", "--scenario", path, "--set", "cluster.tp=2",
                         "--decode", "8x100", "--json")
    assert rc == 0
    shape = BatchShape.from_lists([1] * 8, [100] * 8)
    cm = CostModel("llama-3-8b", "a100-80gb-sxm", tp=2)
    assert json.loads(out)["step_time_s"] == pytest.approx(cm.step_time(shape), rel=1e-12)


@pytest.mark.parametrize("extra, message", [
    (["--tp", "2"], "drop --tp (change the scenario's keys with --set"),
    (["--model", "llama-3-70b", "--dtype", "fp8"], "drop --model, --dtype"),
    (["--pool", "decode"], "--pool decode: the scenario's pools are colocated"),
])
def test_estimate_a_scenario_refuses_the_flags_it_sets(capsys, tmp_path, extra, message) -> None:
    rc, _, err = run_cli(capsys, "estimate", "--scenario", _scenario(tmp_path), "--decode",
                         "8x100", *extra)
    assert rc == 2 and message in err


def test_estimate_without_a_scenario_needs_model_and_hardware(capsys) -> None:
    rc, _, err = run_cli(capsys, "estimate", "--model", "llama-3-8b", "--decode", "8x100")
    assert rc == 2 and "give --model and --hardware, or --scenario FILE" in err
    rc, _, err = run_cli(capsys, "estimate", "--model", "llama-3-8b", "--hardware", "h100-sxm",
                         "--set", "cluster.tp=2", "--decode", "8x100")
    assert rc == 2 and "--set and --pool apply to --scenario FILE" in err
