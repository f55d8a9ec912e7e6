"""Bad input is rejected at the edge with a message naming the request and field."""

from __future__ import annotations

import json

import pytest
import torch

from realexec import LLM, SamplingParams
from realexec.engine.configs import builtin_config
from realexec.engine.device import available_devices, resolve_device
from realexec.engine.kv_cache import KVCacheSpec, num_blocks_from_budget
from realexec.engine.model_loader import REQUIRED_FIELDS, load_model, parse_dtype
from tests.realexec_reference import (
    assert_pool_whole,
    one_thread,  # noqa: F401  (fixture)
    random_prompts,
    reference,
)

pytestmark = pytest.mark.usefixtures("one_thread")

NAME = "tiny-gpt2"


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(NAME, num_gpu_blocks=128, block_size=4)


def test_too_long_prompt_is_rejected_and_the_rest_runs(llm):
    prompts = random_prompts(20, [8, llm.max_model_len + 1, 5])
    sp = SamplingParams(temperature=0, max_tokens=6)
    outs = llm.generate(prompts, sp)
    assert outs[1].finish_reason == "rejected" and outs[1].token_ids == []
    assert "max_model_len" in outs[1].outputs[0].stop_reason
    for i in (0, 2):
        assert outs[i].token_ids == reference(NAME, prompts[i], 6)
    assert_pool_whole(llm)


@pytest.mark.parametrize(
    ("prompts", "params", "match"),
    [
        ([[5, 6], []], None, r"request 1: prompt_token_ids is empty"),
        ([[5, 6], [7, 256]], None, r"request 1: prompt_token_ids\[1\] = 256 is outside the vocabulary"),
        ([[5, 6], [-1]], None, r"request 1: prompt_token_ids\[0\] = -1 is outside"),
        ([[5, 6], [7, "x"]], None, r"request 1: prompt_token_ids\[1\] = 'x' is not an integer"),
        ([[5], [6]], [{}, {"max_tokens": -3}], r"request 1: sampling_params.*max_tokens must be >= 1"),
        ([[5], [6]], [{"temprature": 0.5}, {}], r"request 0: sampling_params: unknown sampling option.*temprature"),
        ([[5], [6]], [{"top_p": 0.0}, {}], r"request 0: sampling_params.*top_p must be in"),
        ([5, 6], None, r"list of prompts"),
        # types and ranges the engine would only trip over mid-step (before: a seed beyond
        # 2^64 failed inside torch and left the request in the engine, failing every later
        # call; n = 2.5 was a TypeError; inf temperature and negative stop ids were taken)
        ([[5]], {"seed": 2**70}, r"request 0: sampling_params.seed must be None \(or -1\) or an integer"),
        ([[5]], {"n": 2.5}, r"request 0: sampling_params.n must be an integer, got 2.5"),
        ([[5]], {"max_tokens": True}, r"max_tokens must be an integer, got True"),
        ([[5]], {"temperature": float("inf")}, r"temperature must be a finite number"),
        ([[5]], {"top_p": float("nan")}, r"top_p must be a finite number"),
        ([[5]], {"stop_token_ids": [-3]}, r"stop_token_ids: -3 is not a token id"),
        ([[5]], {"top_k": -2}, r"top_k must be >= 0 \(0 or -1 = off\)"),
    ],
)
def test_bad_requests_raise_value_error(llm, prompts, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(prompts, params)
    assert_pool_whole(llm)  # nothing of the bad batch was queued
    assert llm.generate([[5, 6]], {"temperature": 0, "max_tokens": 2})[0].finish_reason == "length"


@pytest.mark.parametrize("when", [float("inf"), float("nan"), -1.0, "1"])
def test_bad_arrival_times_are_refused(llm, when):
    """(before: inf overflowed time.sleep after the requests were queued)"""
    with pytest.raises(ValueError, match=r"request 0: arrival_times\[0\] must be a finite number"):
        llm.generate([[5]], None, arrival_times=[when])
    assert_pool_whole(llm)


def test_integer_arrays_are_taken_where_ints_are():
    """numpy and torch integers are integers, in the options of a call (the compiled core
    itself takes only int fields); their floats are not."""
    import numpy as np

    sp = SamplingParams.from_dict({"stop_token_ids": torch.tensor([3, 4]),
                                   "max_tokens": np.int64(5), "seed": np.uint64(7)})
    assert sp.stop_token_ids == (3, 4) and sp.max_tokens == 5 and sp.seed == 7
    assert type(sp.max_tokens) is int
    with pytest.raises(ValueError, match="is not a token id"):
        SamplingParams(stop_token_ids=torch.tensor([1.5]))


def test_vllm_spellings_of_off_are_taken():
    """vLLM reads top_k -1 as 0 (every token) and seed -1 as no seed."""
    sp = SamplingParams(top_k=-1, seed=-1)
    assert sp.top_k == 0 and sp.seed is None


def test_prompts_as_numpy_arrays_are_taken_like_tensors_and_lists(llm):
    """(before: a numpy batch or a numpy prompt was refused as 'not a list of prompts', while a
    torch tensor was taken)"""
    import numpy as np

    prompts = random_prompts(30, [7, 7])
    sp = {"temperature": 0, "max_tokens": 4}
    want = [o.token_ids for o in llm.generate(prompts, sp)]
    for batch in (np.array(prompts), [np.array(p) for p in prompts], torch.tensor(prompts)):
        assert [o.token_ids for o in llm.generate(batch, sp)] == want
    with pytest.raises(ValueError, match=r"prompt_token_ids\[0\] = 1.5 is not an integer"):
        llm.generate([np.array([1.5, 2.0])], sp)


def fail_the_second_step(llm, monkeypatch):
    """Make the engine's second forward raise; return the real forward to restore."""
    real = llm.runner._forward_and_sample
    calls = []

    def fail_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("executor failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(llm.runner, "_forward_and_sample", fail_second)
    return real


def test_a_failed_step_leaves_the_engine_serving(llm, monkeypatch):
    """An exception inside a step (an executor error, Ctrl-C) aborts that call's requests,
    children of n > 1 included, and frees their blocks: the next call runs as on a fresh
    engine (before: the failed requests stayed queued and every later call failed)."""
    prompts = [[5, 6, 7, 8] * 5, [9, 10, 11]]
    want = llm.generate(prompts[:1], {"temperature": 0, "max_tokens": 6})[0].token_ids
    real = fail_the_second_step(llm, monkeypatch)
    with pytest.raises(RuntimeError, match="executor failed"):
        llm.generate(prompts, {"temperature": 0.7, "seed": 1, "n": 2, "max_tokens": 6})
    monkeypatch.setattr(llm.runner, "_forward_and_sample", real)
    assert_pool_whole(llm)
    assert not llm.finished and not llm.runner.generators
    assert llm.generate(prompts[:1], {"temperature": 0, "max_tokens": 6})[0].token_ids == want


def test_a_failed_step_of_the_step_level_api_aborts_what_was_in_flight(llm, monkeypatch):
    """`add_request` / `step` users: a step that raises finishes every request in flight as
    aborted, naming the error, frees their blocks and drops the prefix cache (a part-run step
    may have registered blocks it never wrote, and a retry would have run on swaps and copies
    never done); before, the requests stayed queued on that state."""
    prompt = [5, 6, 7, 8] * 5
    want = reference(NAME, prompt, 6)
    real = fail_the_second_step(llm, monkeypatch)
    llm.add_request("s1", prompt, {"temperature": 0, "max_tokens": 6})
    llm.add_request("s2", [9, 10, 11] * 4, {"temperature": 0.7, "seed": 3, "n": 2, "max_tokens": 6})
    with pytest.raises(RuntimeError, match="executor failed"):
        while llm.has_unfinished_requests():
            llm.step()
    monkeypatch.setattr(llm.runner, "_forward_and_sample", real)
    assert_pool_whole(llm)
    assert not llm.kv_cache_manager.block_pool.cached_hash_to_block and not llm.runner.generators
    aborted = {rid: r for rid, r in llm.finished.items()
               if rid in ("s1", "s2") or r.parent_request_id == "s2"}  # s2's forked sample too
    assert {"s1", "s2"} <= set(aborted)
    for r in aborted.values():
        assert r.finish_reason == "abort"
        assert r.stop_reason == "a step failed: RuntimeError: executor failed"
    for rid in aborted:
        del llm.finished[rid]
    llm.add_request("s3", prompt, {"temperature": 0, "max_tokens": 6})
    while llm.has_unfinished_requests():
        llm.step()
    assert llm.finished.pop("s3").output_token_ids == want


@pytest.mark.parametrize("block_size", [0, -3, 2.5])
def test_a_block_size_below_one_is_refused_naming_the_field(block_size):
    """(before: 0 was a ZeroDivisionError while sizing the pool, -3 a message about KV room)"""
    with pytest.raises(ValueError, match=rf"cache.block_size must be an integer >= 1, got {block_size}"):
        LLM(NAME, block_size=block_size)


def test_unsupported_architecture_lists_the_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"'bert' is not supported.*Llama.*Mistral.*Qwen2.*GPT-2"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match=r"'bert' is not supported"):
        load_model({"model_type": "bert"})


@pytest.mark.parametrize(("text", "message"), [
    ("{bad", r"config.json: not valid JSON"),
    ("[1]", r"config.json: a model config is a JSON object, got list"),
    (b"\xff\xfe{}", r"config.json: not a JSON text file \(invalid start byte at byte 0\)"),
])
def test_a_model_directory_with_a_broken_config_is_named(tmp_path, text, message):
    """(before: json's bare message naming no file, a TypeError, or a bare UnicodeDecodeError)"""
    path = tmp_path / "config.json"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_model(str(tmp_path), torch.float32, "cpu")
    with pytest.raises(ValueError, match=message):  # the file itself (random weights)
        load_model(str(path), torch.float32, "cpu")


def test_model_directory_round_trip(tmp_path):
    """A saved directory (config.json + safetensors) loads to the same logits."""
    src = load_model("tiny-qwen2", seed=3)
    src.model.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    again = load_model(tmp_path)
    assert not again.random_weights
    ids = torch.tensor([random_prompts(21, [12])[0]])
    with torch.inference_mode():
        torch.testing.assert_close(again.model(ids).logits, src.model(ids).logits)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_model(tmp_path)


def test_a_checkpoint_that_does_not_load_or_lacks_weights_is_refused(tmp_path):
    """(before: a SafetensorError traceback; and a checkpoint holding other tensors loaded
    with every missing weight drawn at random, behind a transformers warning, so the engine
    served noise)"""
    from safetensors.torch import save_file

    src = load_model("tiny-llama", seed=3)
    src.model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"its weights do not load \(SafetensorError"):
        load_model(tmp_path)
    save_file({"x": torch.zeros(2)}, str(weights))
    with pytest.raises(ValueError, match=r"the checkpoint lacks 21 of the model's weights "
                                         r"\(e.g. lm_head.weight, .*\); it is not a checkpoint "
                                         r"of this config.json's llama model"):
        load_model(tmp_path)


@pytest.mark.parametrize("kind", ["cuda", "mps"])
def test_absent_device_lists_the_available(kind):
    if kind in available_devices():
        pytest.skip(f"{kind} is present here")
    with pytest.raises(ValueError, match=rf"'{kind}'.*not available.*available: .*cpu"):
        resolve_device(kind)
    with pytest.raises(ValueError, match="not available"):
        LLM(NAME, device=kind, num_gpu_blocks=8)


def test_device_and_dtype_names():
    assert resolve_device(None).type == available_devices()[0]
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="not a torch device"):
        resolve_device("tpu9")
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype("fp16") is torch.float16
    with pytest.raises(ValueError, match="expected one of fp32, bf16, fp16"):
        parse_dtype("int8")


def test_kv_blocks_from_memory_budget():
    spec = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32)
    assert spec.bytes_per_block == 2 * 2 * 2 * 16 * 4 * 4
    n = num_blocks_from_budget(spec, torch.device("cpu"), 0.5, 0, cpu_kv_cache_bytes=10_000)
    assert n == 10_000 // spec.bytes_per_block
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        num_blocks_from_budget(spec, torch.device("cpu"), 1.5, 0)
    llm = LLM(NAME, block_size=4, gpu_memory_utilization=0.9)
    assert llm.kv_cache_manager.num_gpu_blocks > 1000


def test_reduced_precision_runs():
    prompts = random_prompts(22, [5, 9])
    for dtype in ("bf16", "fp16"):
        outs = LLM(NAME, dtype=dtype, num_gpu_blocks=32, block_size=4).generate(
            prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        assert [len(o.token_ids) for o in outs] == [4, 4]


@pytest.mark.parametrize("name, family", [("tiny-mixtral", "Mixtral"),
                                          ("tiny-qwen2-moe", "Qwen2-MoE"),
                                          ("tiny-qwen3-moe", "Qwen3-MoE"),
                                          ("tiny-deepseek-v3", "DeepSeek-V3"),
                                          ("tiny-deepseek-v32", "DeepSeek-V3.2"),
                                          ("tiny-glm5", "GLM-5"),
                                          ("tiny-glm4-moe", "GLM-4.5"),
                                          ("tiny-minimax-m2", "MiniMax-M2"),
                                          ("tiny-olmoe", "OLMoE"),
                                          ("tiny-flex-olmo", "FlexOlmo"),
                                          ("tiny-phimoe", "Phi-3.5-MoE"),
                                          ("tiny-granitemoe", "Granite MoE"),
                                          ("tiny-hunyuan-moe", "Hunyuan MoE"),
                                          ("tiny-ernie4.5-moe", "ERNIE-4.5 MoE"),
                                          ("tiny-dots1", "dots.llm1"),
                                          ("tiny-glm4-moe-lite", "GLM-4.7-Flash"),
                                          ("tiny-exaone-moe", "EXAONE MoE")])
def test_every_moe_family_refuses_a_config_missing_an_expert_field(name, family):
    """Issue 34's bad input for the real executor: an MoE config lacking a field its layers are
    built from is refused naming it (transformers would fill in its largest release's value)."""
    cfg = builtin_config(name)
    model_type = cfg["model_type"]
    for field in REQUIRED_FIELDS[model_type]:
        broken = {k: v for k, v in cfg.items() if k != field}
        with pytest.raises(ValueError, match=f"{family} config is missing field '{field}'"):
            load_model(broken)


def test_hunyuan_moe_takes_experts_per_token_once_per_layer_as_its_release_gives_them():
    """Hunyuan-A13B's config.json lists `moe_topk` per layer; a bad entry is refused naming it."""
    cfg = builtin_config("tiny-hunyuan-moe")
    layers = cfg["num_hidden_layers"]
    listed = load_model({**cfg, "moe_topk": [cfg["moe_topk"]] * layers}, dtype="fp32",
                        device="cpu", seed=0).model
    plain = load_model(cfg, dtype="fp32", device="cpu", seed=0).model
    assert sum(p.numel() for p in listed.parameters()) == sum(
        p.numel() for p in plain.parameters())
    with pytest.raises(ValueError, match=r"'moe_topk' must be a positive integer \(or a list of "
                                         r"them, one per layer\), got \[2, 0\]"):
        load_model({**cfg, "moe_topk": [2, 0]})


def test_a_deepseek_v32_indexer_narrower_than_its_rotary_is_refused():
    """The indexer rotates the first qk_rope_head_dim of its index_head_dim dims."""
    cfg = builtin_config("tiny-deepseek-v32")
    cfg["index_head_dim"] = cfg["qk_rope_head_dim"] - 1
    with pytest.raises(ValueError, match=r"'index_head_dim' \(7\) must be at least "
                                         r"'qk_rope_head_dim' \(8\)"):
        load_model(cfg)


def test_a_glm5_config_whose_first_layer_shares_an_indexer_is_refused():
    """A "shared" layer reuses the previous layer's top-k: the first has none to reuse."""
    cfg = builtin_config("tiny-glm5")
    cfg["indexer_types"] = ["shared", "full", "full", "full"]
    with pytest.raises(ValueError, match="indexer_types must start with 'full'"):
        load_model(cfg)


def test_a_model_directory_with_a_tokenizer_takes_and_gives_text(tmp_path):
    """As vLLM's `LLM`: text prompts are encoded by the directory's tokenizer (its special
    tokens added), every output carries its text; token ids work as before."""
    from realexec.engine.hf_reference import hf_greedy
    from tests.serving_helpers import save_tiny_tokenizer

    src = load_model("tiny-llama", seed=0)
    src.model.save_pretrained(tmp_path)
    save_tiny_tokenizer(str(tmp_path))
    llm = LLM(str(tmp_path))
    prompts = ["t5 t9 t200 t31", "t77 t78"]
    outs = llm.generate(prompts, {"temperature": 0, "max_tokens": 6, "ignore_eos": True})
    for text, out in zip(prompts, outs):
        ids = llm.tokenizer.encode(text)
        assert out.prompt == text and out.prompt_token_ids == ids
        assert out.token_ids == hf_greedy(src.model, ids, 6)[:len(out.token_ids)]
        assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        assert out.text.startswith(" ".join(f"t{t}" for t in out.token_ids[:1]))
    assert llm.generate("t5 t9 t200 t31", {"temperature": 0, "max_tokens": 6,
                                           "ignore_eos": True})[0].token_ids == outs[0].token_ids
    assert llm.generate([[5, 9]], {"max_tokens": 2})[0].prompt is None
    # vLLM's prompt mappings (TextPrompt, TokensPrompt), alone or in a list, and in add_request
    greedy = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
    ids = llm.tokenizer.encode(prompts[0])
    wrapped = llm.generate([{"prompt": prompts[0]}, {"prompt_token_ids": ids}], greedy)
    assert [o.token_ids for o in wrapped] == [outs[0].token_ids] * 2
    assert wrapped[0].prompt == prompts[0] and wrapped[1].prompt is None
    assert llm.generate({"prompt_token_ids": ids}, greedy)[0].token_ids == outs[0].token_ids
    assert llm.add_request("x", {"prompt": prompts[1]}, greedy).prompt_token_ids == \
        llm.tokenizer.encode(prompts[1])


def test_a_prompt_mapping_with_other_keys_is_refused_naming_the_request():
    llm = LLM(NAME, num_gpu_blocks=32, block_size=4)
    with pytest.raises(ValueError, match=r"request 1: a prompt mapping holds 'prompt' .* got "
                                         r"keys \['multi_modal_data', 'prompt_token_ids'\]"):
        llm.generate([[5, 6], {"prompt_token_ids": [5], "multi_modal_data": {}}])
    with pytest.raises(ValueError, match="got keys \\['prompt'\\]"):  # a text, not a number
        llm.generate([{"prompt": 5}])
    assert not llm.has_unfinished_requests()


def test_text_prompts_without_a_tokenizer_are_refused_naming_the_request(tmp_path):
    with pytest.raises(ValueError, match="request 1: a text prompt needs a tokenizer"):
        LLM(NAME).generate([[5, 6], "hello"])
    with pytest.raises(ValueError, match=f"tokenizer {tmp_path}: not a directory with "
                                         "tokenizer.json"):
        LLM(NAME, tokenizer=tmp_path)


def test_stop_strings_cut_the_text_as_vllms_do(tmp_path):
    """`stop`: generation ends at the token whose text completes the string, the text is
    cut before it and `stop_reason` names it; not before `min_tokens`; on the last allowed
    token the string wins over the length limit."""
    from tests.serving_helpers import save_tiny_tokenizer

    load_model("tiny-llama", seed=0).model.save_pretrained(tmp_path)
    save_tiny_tokenizer(str(tmp_path))
    llm = LLM(str(tmp_path))
    greedy = {"temperature": 0, "max_tokens": 10, "ignore_eos": True}
    plain = llm.generate(["t5 t9 t200"], greedy)[0]
    words = plain.text.split()
    # the first word (from the third) whose text is not already in the text before it
    k = next(i for i in range(2, 9) if words[i] not in " ".join(words[:i]))
    out = llm.generate(["t5 t9 t200"], {**greedy, "stop": [words[k], "never"]})[0]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == words[k]
    assert out.token_ids == plain.token_ids[:k + 1] and out.text == " ".join(words[:k]) + " "
    # with min_tokens k + 2 the k-th word no longer stops it: the next word holding it does
    late = llm.generate(["t5 t9 t200"], {**greedy, "stop": words[k], "min_tokens": k + 2})[0]
    j = next((i for i in range(k + 1, 10) if words[k] in words[i]), None)
    assert late.finish_reason == ("length" if j is None else "stop")
    assert late.token_ids == plain.token_ids[:10 if j is None else j + 1]
    assert words[9] not in " ".join(words[:9])  # (this seed's output)
    last = llm.generate(["t5 t9 t200"], {**greedy, "stop": words[9]})[0]
    assert last.finish_reason == "stop" and len(last.token_ids) == 10
    assert last.text == " ".join(words[:9]) + " "
    assert_pool_whole(llm)
    with pytest.raises(ValueError, match="request 0: sampling_params.stop strings need a "
                                         "tokenizer"):
        LLM(NAME).generate([[5]], {"stop": "x"})
    with pytest.raises(ValueError, match="stop must be a string or a list of non-empty"):
        llm.generate([[5]], {"stop": [""]})


def test_chat_renders_the_tokenizer_template_as_vllms_llm_chat(tmp_path):
    from tests.serving_helpers import save_tiny_tokenizer

    load_model("tiny-llama", seed=0).model.save_pretrained(tmp_path)
    save_tiny_tokenizer(str(tmp_path))
    llm = LLM(str(tmp_path))
    llm.tokenizer.chat_template = (
        "{% for m in messages %}t3 {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}t4{% endif %}")
    conv = [{"role": "system", "content": "t10 t11"}, {"role": "user", "content": "t12"}]
    greedy = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
    (one,) = llm.chat(conv, greedy)
    assert one.prompt_token_ids == [3, 10, 11, 3, 12, 4]
    assert one.token_ids == llm.generate([[3, 10, 11, 3, 12, 4]], greedy)[0].token_ids
    both = llm.chat([conv, conv[1:]], greedy)
    assert [o.prompt_token_ids for o in both] == [[3, 10, 11, 3, 12, 4], [3, 12, 4]]
    with pytest.raises(ValueError, match="conversation 1, message 0: must be a dict with string"):
        llm.chat([conv, [{"role": "user"}]])
    with pytest.raises(ValueError, match="chat needs a tokenizer"):
        LLM(NAME).chat(conv)


def test_a_multimodal_gemma3_config_without_its_text_config_is_refused():
    cfg = builtin_config("tiny-gemma3-mm")
    del cfg["text_config"]
    with pytest.raises(ValueError, match="missing field 'text_config'"):
        load_model(cfg)
    cfg = builtin_config("tiny-gemma3-mm")
    del cfg["text_config"]["head_dim"]
    with pytest.raises(ValueError, match="text_config: Gemma 3 config is missing field 'head_dim'"):
        load_model(cfg)
    cfg = builtin_config("tiny-gemma3-mm")
    cfg["text_config"]["attn_logit_softcapping"] = 50.0
    with pytest.raises(ValueError, match="soft-caps Gemma 2's scores only"):
        load_model(cfg)


@pytest.mark.parametrize("field, value, says", [
    ("attn_logit_softcapping", 50.0, "soft-caps Gemma 2's scores only"),
    ("use_bidirectional_attention", True, "not a causal LM"),
    ("head_dim", None, "Gemma 3 config is missing field 'head_dim'"),
    ("layer_types", ["sliding_attention", "global"], "field 'layer_types' must list"),
    ("sliding_window", 0, "field 'sliding_window' must be a positive integer"),
])
def test_a_gemma3_config_the_executor_cannot_run_is_refused_naming_the_field(field, value, says):
    cfg = builtin_config("tiny-gemma3")
    cfg[field] = value
    if value is None:
        del cfg[field]
    with pytest.raises(ValueError, match=says):
        load_model(cfg)


@pytest.mark.parametrize("name", ["tiny-gemma2", "tiny-gemma3", "tiny-gemma3-mm"])
def test_a_gemma3_checkpoint_directory_runs_its_own_weights(tmp_path, name):
    """A saved Gemma 3 checkpoint, tied embeddings and all, loads from its directory and
    decodes as transformers' own `generate` does: the text release (1B) and the multimodal
    one (4B-27B, whose text model runs text prompts)."""
    from realexec.engine.hf_reference import hf_greedy

    src = load_model(name, seed=3)
    src.model.save_pretrained(tmp_path)
    prompts = random_prompts(7, [4, 17, 30])  # 17 and 30 run past the 10-token window
    outs = LLM(str(tmp_path), block_size=4).generate(
        prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for p, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(src.model, p, 8)


@pytest.mark.parametrize("field", REQUIRED_FIELDS["qwen3"])
def test_a_qwen3_config_missing_a_shape_field_is_refused_naming_it(field):
    """Qwen3Config would fill it in from an 8B-class release (128-wide heads, 22,016 MLP)."""
    cfg = {k: v for k, v in builtin_config("tiny-qwen3").items() if k != field}
    with pytest.raises(ValueError, match=f"Qwen3 config is missing field '{field}'"):
        load_model(cfg)


def test_a_qwen3_checkpoint_directory_runs_its_own_weights(tmp_path):
    """A saved dense Qwen3 (per-head q/k norms, heads wider than hidden / heads) loads from its
    directory and decodes as transformers' own `generate` does."""
    from realexec.engine.hf_reference import hf_greedy

    src = load_model("tiny-qwen3", seed=3)
    src.model.save_pretrained(tmp_path)
    prompts = random_prompts(7, [4, 17, 30])
    outs = LLM(str(tmp_path), block_size=4).generate(
        prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for p, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(src.model, p, 8)


def test_a_llama4_multimodal_checkpoint_runs_its_text_model(tmp_path):
    """Scout's and Maverick's config.json is the multimodal `llama4` (the text model's shape
    under text_config): the loader runs its text model on the checkpoint's own weights, as
    transformers' `AutoModelForCausalLM` loads it, and decodes as that model's `generate`."""
    import transformers

    from realexec.engine.hf_reference import hf_greedy

    text = {k: v for k, v in builtin_config("tiny-llama4").items() if k != "model_type"}
    vision = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 64, "image_size": 28, "patch_size": 14,
              "vision_output_dim": 64, "projector_input_dim": 64, "projector_output_dim": 64}
    torch.manual_seed(3)
    cfg = transformers.Llama4Config(text_config=text, vision_config=vision)
    transformers.Llama4ForConditionalGeneration(cfg).save_pretrained(tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    prompts = random_prompts(7, [4, 17, 30])  # past the 8-token chunks
    outs = LLM(str(tmp_path), block_size=4).generate(
        prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for p, out in zip(prompts, outs):
        assert out.token_ids == hf_greedy(ref, p, 8)
    del text["intermediate_size_mlp"]
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "llama4", "text_config": text}))
    with pytest.raises(ValueError, match="text_config: Llama 4 .its text model. config is "
                                         "missing field 'intermediate_size_mlp'"):
        load_model(tmp_path / "config.json")


def test_a_smollm3_config_with_a_sliding_window_is_refused():
    cfg = {**builtin_config("tiny-smollm3"), "use_sliding_window": True, "sliding_window": 8}
    with pytest.raises(ValueError, match="runs SmolLM3 without a window"):
        load_model(cfg)
