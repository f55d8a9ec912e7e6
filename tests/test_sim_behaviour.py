"""Behaviour a correct simulator of this system must show (orderings and invariants)."""

import json

import pytest

from simulator.core import BatchShape
from simulator.cost.costmodel import CostModel
from tests.sim_helpers import BASE, merged, sim


def test_every_request_is_accounted_for(traces_dir):
    res = sim({"workload": {"synthetic": None, "trace": str(traces_dir / "azure2023_AzureLLMInferenceTrace_conv.csv"),
                            "window_s": [0, 120]},
               "scheduler": {"max_model_len": 2048}})
    r = res.summary["requests"]
    assert r["total"] > 400
    assert r["finished"] + r["rejected"] == r["total"] and r["rejected"] > 0  # some prompts exceed 2048


def test_low_rate_latencies_approach_the_cost_model_step_times():
    res = sim({"workload": {"synthetic": {
        "num_requests": 20, "arrival": {"process": "constant", "rate": 0.2},
        "prompt_len": {"dist": "fixed", "value": 1000}, "output_len": {"dist": "fixed", "value": 50}}}})
    cm = CostModel("llama-3-8b", "h100-sxm")
    prompt = cm.step_time(BatchShape.from_lists([1000], [0]))
    decode = cm.step_time(BatchShape.from_lists([1], [1000]))
    s = res.summary
    assert s["ttft_s"]["p50"] == pytest.approx(prompt, rel=0.01)
    assert s["tpot_s"]["p50"] == pytest.approx(decode, rel=0.02)
    assert s["queueing_s"]["max"] < 1e-9


def test_orca_beats_static_batching_on_mixed_lengths():
    patch = {"scheduler": {"max_num_seqs": 16},
             "workload": {"synthetic": {"num_requests": 300, "arrival": {"process": "poisson", "rate": 20.0},
                                        "output_len": {"dist": "lognormal", "mean": 200, "sigma": 1.0, "min": 1, "max": 2000}}}}
    orca = sim(merged(patch, {"scheduler": {"batching": "continuous"}})).summary
    static = sim(merged(patch, {"scheduler": {"batching": "static"}})).summary
    assert orca["throughput"]["output_tokens_per_s"] >= static["throughput"]["output_tokens_per_s"]
    assert orca["queueing_s"]["mean"] < 0.5 * static["queueing_s"]["mean"]


def test_pd_slower_link_raises_ttft_not_tpot_at_low_load():
    low = {"workload": {"synthetic": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 0.5}}}}
    pd = lambda link: merged(low, {"cluster": {"pd": {"link": link}}})  # noqa: E731
    fast = sim(pd("nvlink4")).summary
    slow = sim(pd("ethernet-100g")).summary
    assert slow["ttft_s"]["p50"] > fast["ttft_s"]["p50"] * 1.2
    assert slow["tpot_s"]["p50"] == pytest.approx(fast["tpot_s"]["p50"], rel=0.02)
    assert slow["kv_transfer_s"]["mean"] > fast["kv_transfer_s"]["mean"]


def test_prefix_caching_on_mooncake_raises_hit_rate_and_lowers_ttft(traces_dir):
    # Mooncake's 10-40k-token prompts: an H200 holding Qwen2.5-7B's small KV (57 KB/token)
    # keeps ~2M tokens, enough to see reuse; the trace's own (infinite-cache) reuse for
    # the first 1000 requests is ~17%.
    patch = {"model": "qwen2.5-7b", "hardware": "h200-sxm",
             "workload": {"synthetic": None, "trace": str(traces_dir / "mooncake_synthetic_trace.jsonl"),
                          "limit": 1000, "target_rate": 1.0},
             "scheduler": {"max_model_len": 131072}}
    on = sim(merged(patch, {"cache": {"enable_prefix_caching": True}})).summary
    off = sim(merged(patch, {"cache": {"enable_prefix_caching": False}})).summary
    big = sim(merged(patch, {"cache": {"num_gpu_blocks": 1_500_000}})).summary
    assert off["kv"]["prefix_hit_rate"] == 0.0 < on["kv"]["prefix_hit_rate"] < big["kv"]["prefix_hit_rate"]
    assert big["kv"]["prefix_hit_rate"] == pytest.approx(0.17, abs=0.02)
    assert on["ttft_s"]["mean"] < off["ttft_s"]["mean"]
    assert big["ttft_s"]["mean"] < on["ttft_s"]["mean"]


def test_tiny_kv_pool_preempts_and_still_finishes_everyone():
    for mode, swap in (("recompute", 0.0), ("swap", 4.0)):
        s = sim({"cache": {"num_gpu_blocks": 200, "swap_space_gb": swap},
                 "scheduler": {"preemption_mode": mode, "max_model_len": 3000},
                 "workload": {"synthetic": {"arrival": {"process": "poisson", "rate": 50.0}}}}).summary
        assert s["preemptions"] > 0, mode
        assert s["requests"]["finished"] == s["requests"]["total"] == 200


def test_same_scenario_and_seed_give_identical_summary(tmp_path):
    a, b = sim(), sim()
    for res, d in ((a, tmp_path / "a"), (b, tmp_path / "b")):
        res.write(d)
    sa = json.loads((tmp_path / "a" / "summary.json").read_text())
    sb = json.loads((tmp_path / "b" / "summary.json").read_text())
    for s in (sa, sb):
        s.pop("wall_s")
        s["sim"].pop("requests_per_wall_s")
    assert sa == sb


@pytest.mark.parametrize("router", ["least_outstanding_tokens", "least_kv_usage"])
def test_decode_bursts_do_not_change_results(router):
    # least_kv_usage reads KV usage, which a decode burst's new blocks change: a fuzz found
    # its routes differing from step-by-step while replicas reported the usage of the burst's
    # start; they now report what the steps scheduled by then took (SimReplica.kv_usage)
    patch = {"cluster": {"replicas": 2, "router": router},
             "cache": {"num_gpu_blocks": 400}, "scheduler": {"max_model_len": 3000}}
    burst = sim(patch)
    step = sim(merged(patch, {"sim": {"max_decode_burst": 1}}))
    # the burst run ran bursts: far fewer SimPy events (the ids the clock handed out)
    assert 3 * next(burst.cluster.env._eid) < next(step.cluster.env._eid)
    assert step.summary["sim"]["num_steps"] == burst.summary["sim"]["num_steps"]
    for a, b in zip(burst.requests, step.requests):
        assert a.annotations["replica"] == b.annotations["replica"]
        assert list(a.token_times) == list(b.token_times)  # bit for bit


def test_a_replica_reports_mid_burst_the_kv_usage_stepping_would_show(monkeypatch):
    """Read at every instant a request arrives, each replica's `kv_usage` with bursts equals
    the one step-by-step simulation shows at that instant (the router's whole input)."""
    from simulator.cluster.router import Router

    seen: list[list[float]] = []
    route = Router.route

    def recording(self, req):
        seen.append([r.kv_usage for r in self.replicas])
        return route(self, req)

    monkeypatch.setattr(Router, "route", recording)
    patch = {"cluster": {"replicas": 3, "router": "least_kv_usage"},
             "workload": {"synthetic": {"num_requests": 120,
                                        "arrival": {"process": "poisson", "rate": 30.0}}}}
    sim(patch)
    with_bursts, seen[:] = list(seen), []
    sim(merged(patch, {"sim": {"max_decode_burst": 1}}))
    assert with_bursts == seen and any(u > 0 for row in seen for u in row)


def test_bursts_cut_early_in_a_run_stay_bit_identical():
    # a burst cut by an arrival waited for its planned end with timeout(end - now), which
    # left the clock an ulp off end when end and now were far apart (early in a run); the
    # next steps then added from there (a fuzz of kvpd simulate found token times 1 ulp off)
    base = {"name": "t", "model": "qwen3-30b-a3b", "hardware": "h200-sxm", "seed": 3,
            "engine": {"name": "sglang", "version": "0.5.12"}, "output": {"plots": False},
            "cluster": {"replicas": 3, "tp": 2},
            "scheduler": {"capacity_policy": "reserve_ratio", "first_token_from_decode": True},
            "workload": {"ignore_eos": True, "synthetic": {
                "num_requests": 9, "arrival": {"process": "gamma", "rate": 5, "cv": 3},
                "output_len": {"dist": "fixed", "value": 127},
                "prompt_len": {"dist": "uniform", "min": 1, "max": 64}}}}
    burst = sim(base, base={})
    step = sim(merged(base, {"sim": {"max_decode_burst": 1}}), base={})
    assert burst.summary["sim"]["num_steps"] == step.summary["sim"]["num_steps"]
    for a, b in zip(burst.requests, step.requests):
        assert list(a.token_times) == list(b.token_times)  # bit for bit


def test_routers_spread_load():
    for router in ("round_robin", "least_outstanding_tokens", "least_kv_usage", "prefix_aware"):
        res = sim({"cluster": {"replicas": 3, "router": router}})
        used = {r.annotations["replica"] for r in res.requests}
        assert used == {"r0", "r1", "r2"}, router
        assert res.summary["requests"]["finished"] == 200


def test_tp_helps_a_70b_decode():
    base = merged(BASE, {"model": "llama-3-70b"})
    tp4 = sim({"cluster": {"tp": 4}}, base).summary
    tp8 = sim({"cluster": {"tp": 8}}, base).summary
    assert tp8["tpot_s"]["p50"] < tp4["tpot_s"]["p50"]


def test_pd_first_token_at_prefill_moves_the_transfer_out_of_ttft():
    low = {"workload": {"synthetic": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 0.5}}}}
    at_decode = sim(merged(low, {"cluster": {"pd": {"link": "ethernet-100g"}}})).summary
    at_prefill = sim(merged(low, {"cluster": {"pd": {"link": "ethernet-100g", "first_token": "prefill"}}})).summary
    assert at_prefill["ttft_s"]["p50"] < at_decode["ttft_s"]["p50"]
    assert at_prefill["itl_s"]["max"] > at_decode["itl_s"]["max"]


def test_sliding_window_admits_more_long_requests_at_once():
    """Mistral-7B-v0.1 (every layer slides 4096 tokens) on a 24 GB A10G, 12k-token prompts:
    its blocks that slid out of the window are freed, so more requests decode together than
    with the same model at full attention (sliding_window: null), and none is lost."""
    mistral = {"architectures": ["MistralForCausalLM"], "num_hidden_layers": 32,  # config.json
               "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768,
               "tie_word_embeddings": False}
    patch = {"hardware": "a10g", "scheduler": {"max_num_seqs": 64},
             "workload": {"synthetic": {
                 "num_requests": 24, "arrival": {"process": "poisson", "rate": 50.0},
                 "prompt_len": {"dist": "fixed", "value": 12000},
                 "output_len": {"dist": "fixed", "value": 300}}}}
    batch = {}
    for window in (None, 4096):
        res = sim(merged(patch, {"model": {**mistral, "sliding_window": window}}))
        assert res.summary["requests"]["finished"] == 24
        batch[window] = max(res.timeline.columns()["batch_size"])
    assert batch[4096] >= 2 * batch[None]


def test_prompt_steps_of_their_own_pause_decodes_and_keep_bursts_exact():
    """scheduler.mixed_batches false (SGLang, vLLM V0): decodes wait while prompts run, so
    TPOT rises against mixed steps; decode bursts still equal step by step."""
    patch = {"cache": {"num_gpu_blocks": 400}, "scheduler": {"max_model_len": 3000}}
    mixed = sim(patch)
    separate = sim(merged(patch, {"scheduler": {"mixed_batches": False}}))
    step = sim(merged(patch, {"scheduler": {"mixed_batches": False},
                              "sim": {"max_decode_burst": 1}}))
    assert separate.summary["requests"]["finished"] == 200
    assert separate.summary["tpot_s"]["mean"] > mixed.summary["tpot_s"]["mean"]
    assert step.summary["sim"]["num_steps"] == separate.summary["sim"]["num_steps"]
    for a, b in zip(separate.requests, step.requests):
        assert list(a.token_times) == list(b.token_times)  # bit for bit
