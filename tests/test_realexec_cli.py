"""`kvpd generate`, `kvpd bench ladder` (tiny model, tiny workloads) and the step-level API."""

from __future__ import annotations

import json

import pytest

from kvpd.cli import main
from realexec import LLM, SamplingParams
from tests.realexec_reference import (
    assert_pool_whole,
    one_thread,  # noqa: F401  (fixture)
    random_prompts,
    reference,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_kvpd_generate_writes_the_simulator_summary(tmp_path, capsys):
    rc = main(["generate", "--model", "tiny-qwen2", "--prompt-ids", "5,6,7,8",
               "--prompt-ids", "9,10", "--max-tokens", "4", "--ignore-eos",
               "--num-gpu-blocks", "16", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.count("finish=length") == 2
    assert reference("tiny-qwen2", [5, 6, 7, 8], 4) == [
        int(t) for t in out.split("[0.0]")[1].split(": ")[1].split()[0].split(",")]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["requests"]["total"] == 2 and summary["requests"]["finished"] == 2
    for key in ("output_tokens_per_s", "requests_per_s"):
        assert summary["throughput"][key] > 0
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(summary[key]) >= {"mean", "p50", "p90", "p99"}
    assert {"attainment", "goodput_rps"} <= set(summary["slo"])
    assert {"peak_usage", "prefix_hit_rate"} <= set(summary["kv"])
    assert (tmp_path / "requests.parquet").stat().st_size > 0
    rows = json.loads((tmp_path / "outputs.json").read_text())
    assert [len(r["outputs"][0]["token_ids"]) for r in rows] == [4, 4]


def test_kvpd_generate_bad_input_exits_2(capsys):
    assert main(["generate", "--model", "tiny-llama", "--prompt-ids", "5,999",
                 "--num-gpu-blocks", "8"]) == 2
    assert "request 0: prompt_token_ids[1] = 999 is outside the vocabulary" in capsys.readouterr().err
    assert main(["generate", "--model", "no-such-model", "--prompt-ids", "5"]) == 2


def test_kvpd_generate_takes_text_prompts_with_a_tokenizer(tmp_path, capsys):
    from realexec.engine.model_loader import load_model
    from tests.serving_helpers import save_tiny_tokenizer

    model = tmp_path / "model"
    load_model("tiny-llama", seed=0).model.save_pretrained(model)
    save_tiny_tokenizer(str(model))
    assert main(["generate", "--model", str(model), "--prompt", "t5 t6 t7", "--prompt-ids",
                 "5,6,7", "--max-tokens", "4", "--ignore-eos", "--out",
                 str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "outputs.json").read_text())
    ids, text = rows  # --prompt-ids first, then --prompt
    assert text["prompt"] == "t5 t6 t7" and "prompt" not in ids
    assert text["outputs"][0]["text"] == " ".join(f"t{t}" for t in text["outputs"][0]["token_ids"])
    assert repr(text["outputs"][0]["text"]) in capsys.readouterr().out
    assert main(["generate", "--model", "tiny-llama", "--prompt", "t5"]) == 2
    assert "--prompt needs a tokenizer: tiny-llama is not a directory" in capsys.readouterr().err


def test_kvpd_bench_ladder_tiny(tmp_path, capsys):
    from workloads.shared_traces import azure_conv_path

    if not azure_conv_path().exists():
        pytest.skip(f"shared trace {azure_conv_path()} not present")
    rc = main(["bench", "ladder", "--model", "tiny-llama", "--fixed-requests", "2",
               "--prompt-len", "12", "--max-tokens", "5", "--trace-requests", "6",
               "--max-prompt", "40", "--max-output", "7", "--rate", "500", "--max-batch", "3",
               "--repeats", "2", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "ladder.json").read_text())
    assert [r["rung"] for r in report["rungs"]] == [1, 2, 3, 4, 5, 6]
    c = report["checks"]
    assert c["identical_1_2_3"] == 2 and c["identical_4_5_6"] == 6  # same greedy tokens
    assert report["prefix_hit_rates"] == {"3": 0.0, "4": 0.0, "5": 0.0}  # repeats reuse nothing
    assert (tmp_path / "ladder.png").stat().st_size > 0
    assert "(5)/(6)" in capsys.readouterr().out


def test_step_level_api_with_abort():
    llm = LLM("tiny-mistral", num_gpu_blocks=64, block_size=4)
    prompts = random_prompts(30, [7, 11])
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    a = llm.add_request("a", prompts[0], sp)
    b = llm.add_request("b", prompts[1], {"temperature": 0, "max_tokens": 10, "ignore_eos": True})
    finished = []
    steps = 0
    while llm.has_unfinished_requests():
        out = llm.step()
        steps += 1
        finished += out.finished
        if steps == 3:
            assert llm.abort_request("b")
    assert {r.request_id for r in finished} == {"a", "b"}
    assert a.finish_reason == "length" and a.output_token_ids == reference(
        "tiny-mistral", prompts[0], 10)
    assert b.finish_reason == "abort" and 0 < len(b.output_token_ids) < 10
    assert not llm.abort_request("nope")
    assert_pool_whole(llm)


def test_generate_warms_up_untimed_and_leaves_the_engine_as_fresh(tmp_path, capsys):
    from realexec import LLM

    llm = LLM("tiny-llama", num_gpu_blocks=16)
    llm.warm_up(6)
    stats = llm.kv_cache_manager.get_stats()
    assert stats.prefix_queries_tokens == 0 and stats.peak_usage == stats.usage == 0.0
    assert not llm.kv_cache_manager.block_pool.cached_hash_to_block  # no warm-up prefix hits
    sampled = LLM("tiny-llama", num_gpu_blocks=16).generate([[5, 6, 7, 8]], {"max_tokens": 3})
    # the warm-up is greedy: it draws nothing from the engine's sampling generator
    again = llm.generate([[5, 6, 7, 8]], {"max_tokens": 3})
    assert again[0].outputs[0].token_ids == sampled[0].outputs[0].token_ids
    out = llm.generate([[5, 6, 7, 8]], {"max_tokens": 3, "ignore_eos": True, "temperature": 0})
    assert out[0].request_id == "1"
    assert out[0].outputs[0].token_ids == reference("tiny-llama", [5, 6, 7, 8], 3)
    for flag in ([], ["--no-warmup"]):
        assert main(["generate", "--model", "tiny-llama", "--prompt-ids", "5,6,7,8",
                     "--max-tokens", "3", "--ignore-eos", "--out", str(tmp_path / "o"), *flag]) == 0
        summary = json.loads((tmp_path / "o" / "summary.json").read_text())
        assert summary["requests"]["total"] == 1 and summary["kv"]["prefix_hit_rate"] == 0.0
    assert capsys.readouterr().out.count("finish=length") == 2
