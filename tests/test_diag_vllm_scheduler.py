"""The kvpd side of bench/diagnostics/vllm_scheduler.py (its vLLM side needs a vLLM wheel and
is run by hand): the trace it compares is kvpd's scheduler under the vllm preset."""

from __future__ import annotations

from tests.bench_helpers import load_diagnostic

diag = load_diagnostic("vllm_scheduler")


def test_the_preset_limits_and_pool_are_vllm_0_11s_for_the_gpu():
    h100, prefix, blocks, window = diag.kvpd_setup("qwen3-14b", "h100-sxm", "0.11.0")
    a100, _, _, _ = diag.kvpd_setup("qwen3-14b", "a100-80gb-sxm", "0.11.0")
    assert (h100.max_num_seqs, h100.max_num_batched_tokens) == (1024, 8192)
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)
    assert prefix and blocks > 10_000 and window == {}


def test_models_mixing_sliding_and_full_layers_get_the_hybrid_managers_groups():
    _, _, _, gpt_oss = diag.kvpd_setup("gpt-oss-120b", "h100-sxm", "0.11.0")
    _, _, _, gemma = diag.kvpd_setup("gemma-3-27b", "h100-sxm", "0.11.0")
    assert gpt_oss == {"sliding_window": 128, "sliding_groups": 1}
    assert gemma == {"sliding_window": 1024, "sliding_groups": 6}
    _, _, _, before = diag.kvpd_setup("gpt-oss-120b", "h100-sxm", "0.9.1")
    assert before == {}
    _, _, _, mistral = diag.kvpd_setup("mistral-7b", "h100-sxm", "0.11.0")
    assert mistral == {"sliding_window": 4096, "free_outside_window": True}


def test_a_linear_attention_model_holds_one_state_block_per_group_in_vllms_blocks():
    cfg, prefix, blocks, state = diag.kvpd_setup("qwen3.5-27b", "h100-sxm", "0.11.0")
    assert state == {"state_blocks": 3, "block_size": 784} and prefix is False
    trace = diag.kvpd_trace(cfg, blocks=60, prefix=False, n=20, prompt=1000, out=800,
                            window=state)
    assert trace[-1][2] > 0  # a starved pool preempts
    assert sum(s[0] for s in trace) > 20 * (1000 + 800 - 1)


def test_a_starved_pool_preempts_and_every_token_is_accounted_for():
    cfg, _, _, _ = diag.kvpd_setup("qwen3-14b", "a100-80gb-sxm", "0.11.0")
    n, prompt, out = 40, 256, 300
    trace = diag.kvpd_trace(cfg, blocks=200, prefix=False, n=n, prompt=prompt, out=out,
                            window={})
    steps = len(trace)
    preempted = trace[-1][2]
    assert preempted > 0
    # each request computes its prompt and out - 1 decodes at least (its first token comes
    # from the prompt's step); a preemption recomputes what it had
    assert sum(s[0] for s in trace) > n * (prompt + out - 1)
    assert all(s[0] <= cfg.max_num_batched_tokens and s[1] <= cfg.max_num_seqs for s in trace)
    assert [s[2] for s in trace] == sorted(s[2] for s in trace) and steps >= out


def test_first_difference():
    a = [[1, 1, 0], [2, 1, 0]]
    assert diag.first_difference(a, [r[:] for r in a]) is None
    assert diag.first_difference(a, [[1, 1, 0], [2, 1, 1]]) == 1
    assert diag.first_difference(a, a[:1]) == 1


def test_before_0_8_the_preset_runs_v0s_block_manager():
    cfg, prefix, _, _ = diag.kvpd_setup("qwen3-14b", "h100-sxm", "0.7.3")
    assert (cfg.prompt_allocation, cfg.admission_watermark, cfg.append_needs_free_block,
            prefix) == ("whole_prompt", 0.01, True, False)
    short, _, _, _ = diag.kvpd_setup("qwen3-14b", "h100-sxm", "0.7.3", max_model_len=8192)
    assert not short.enable_chunked_prefill and not short.mixed_batches
    assert short.max_num_batched_tokens == 8192
