"""Property: a simulation with decode bursts equals the same one step by step, bit for bit.

`sim.max_decode_burst` is a speed setting only (docs/scenarios.md). Random small scenarios
across routers, engine presets, schedulers, PD and closed loops must give the same token
times and the same routes with bursts (1024) and without (1). A fuzz of `kvpd simulate` found
two ways this broke (a router reading KV usage inside a burst; a clock an ulp off after a
burst was cut), each now also an `@example` here.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, reject, settings
from hypothesis import strategies as st

from tests.sim_helpers import merged, sim

# gpt-oss-20b mixes 128-token sliding-window and full-attention layers: under the vllm
# preset its sliding layers get KV cache groups of their own (blocks slide out mid-burst)
MODELS = [("llama-3.1-8b", "h100-sxm", 1), ("qwen3-30b-a3b", "h200-sxm", 2),
          ("gpt-oss-20b", "h100-sxm", 1)]
ENGINES = [None, {"name": "vllm", "version": "0.11.0"}, {"name": "sglang", "version": "0.5.12"},
           {"name": "tensorrt-llm"}]


@st.composite
def scenarios(draw) -> dict:
    model, hardware, tp = draw(st.sampled_from(MODELS))
    sc: dict = {"name": "p", "seed": draw(st.integers(0, 3)), "model": model,
                "hardware": hardware, "cluster": {"tp": tp},
                "output": {"plots": False, "timeseries": draw(st.booleans())}}
    engine = draw(st.sampled_from(ENGINES))
    if engine:
        sc["engine"] = engine
    arrival = draw(st.sampled_from([{"process": "burst"},
                                    {"process": "poisson", "rate": 20.0},
                                    {"process": "gamma", "rate": 5.0, "cv": 3.0}]))
    synthetic = {"num_requests": draw(st.integers(3, 24)), "arrival": arrival,
                 "prompt_len": {"dist": "uniform", "min": 1, "max": draw(st.sampled_from([64, 900]))},
                 "output_len": {"dist": "uniform", "min": 1, "max": draw(st.sampled_from([16, 200]))}}
    if draw(st.booleans()):
        synthetic["shared_prefix"] = {"num_prefixes": 2, "prefix_len": 48, "fraction": 0.5}
    sc["workload"] = {"synthetic": synthetic}
    if draw(st.booleans()):
        sc["workload"]["max_concurrency"] = draw(st.integers(1, 6))
    scheduler: dict = {}
    if draw(st.booleans()):
        scheduler["capacity_policy"] = draw(st.sampled_from(
            ["max_utilization", "guaranteed_no_evict", "reserve_ratio"]))
    if draw(st.booleans()):
        scheduler["max_num_batched_tokens"] = draw(st.sampled_from([256, 2048]))
    if draw(st.booleans()):
        scheduler["first_token_from_decode"] = True
    sc["scheduler"] = scheduler
    if draw(st.booleans()):  # a small pool: preemptions
        sc["cache"] = {"num_gpu_blocks": 400}
    layout = draw(st.sampled_from(["one", "replicas", "pd"]))
    if layout == "replicas":
        sc["cluster"].update(replicas=draw(st.integers(2, 3)), router=draw(st.sampled_from(
            ["round_robin", "least_outstanding_tokens", "least_kv_usage", "prefix_aware"])))
    elif layout == "pd":
        sc["cluster"]["pd"] = {"prefill": {"tp": tp}, "decode": {"tp": tp, "replicas": 2,
                               "router": draw(st.sampled_from(["round_robin", "least_kv_usage"]))}}
        scheduler.pop("first_token_from_decode", None)
    return sc


def _same_with_and_without_bursts(sc: dict) -> None:
    try:
        burst = sim(sc, base={})
    except ValueError:  # a scenario kvpd refuses (e.g. a burst the pool can never serve)
        reject()
    step = sim(merged(sc, {"sim": {"max_decode_burst": 1}}), base={})
    assert burst.summary["requests"] == step.summary["requests"]
    assert burst.summary["sim"]["num_steps"] == step.summary["sim"]["num_steps"]
    for a, b in zip(burst.requests, step.requests, strict=True):
        assert a.annotations.get("replica") == b.annotations.get("replica"), a.request_id
        assert list(a.token_times) == list(b.token_times), a.request_id  # bit for bit


LEAST_KV = {"name": "p", "model": "qwen3-30b-a3b", "hardware": "h200-sxm", "seed": 0,
            "cluster": {"tp": 2, "replicas": 3, "router": "least_kv_usage"},
            "output": {"plots": False, "timeseries": False},
            "scheduler": {"max_num_batched_tokens": 256},
            "workload": {"synthetic": {
                "num_requests": 24, "arrival": {"process": "poisson", "rate": 20.0},
                "prompt_len": {"dist": "uniform", "min": 1, "max": 900},
                "output_len": {"dist": "uniform", "min": 1, "max": 200}}}}


# a closed loop sending when a request finishes, and a burst after an early arrival: the
# SimPy clock landed an ulp or two off a step's planned end (no delay reaches it when the sum
# rounds on a tie), so the next step, or the next send, started there
CLOSED_LOOP = {"name": "p", "seed": 1, "model": "qwen3-30b-a3b", "hardware": "h200-sxm",
               "cluster": {"tp": 2, "replicas": 2, "router": "least_outstanding_tokens"},
               "output": {"plots": False, "timeseries": False},
               "scheduler": {"first_token_from_decode": True},
               "workload": {"max_concurrency": 2, "synthetic": {
                   "num_requests": 3, "arrival": {"process": "burst"},
                   "prompt_len": {"dist": "uniform", "min": 1, "max": 64},
                   "output_len": {"dist": "uniform", "min": 1, "max": 16}}}}
TIE = {"name": "p", "seed": 3, "model": "llama-3.1-8b", "hardware": "h100-sxm",
       "cluster": {"tp": 1}, "output": {"plots": False, "timeseries": True},
       "scheduler": {"first_token_from_decode": True},
       "workload": {"synthetic": {
           "num_requests": 3, "arrival": {"process": "gamma", "rate": 5.0, "cv": 3.0},
           "prompt_len": {"dist": "uniform", "min": 1, "max": 64},
           "output_len": {"dist": "uniform", "min": 1, "max": 200},
           "shared_prefix": {"num_prefixes": 2, "prefix_len": 48, "fraction": 0.5}}}}

# a closed loop whose send, caused by one replica's finish, woke another mid-burst exactly at
# one of its step boundaries: the burst broke there and took the request into the step that
# begins at that instant, where step by step that step was already scheduled without it
BOUNDARY = {"name": "p", "seed": 5, "model": "glm-4.5-air", "hardware": "mi300x",
            "engine": {"name": "tensorrt-llm"}, "cache": {"block_size": 8, "kv_cache_dtype": "fp8"},
            "cluster": {"replicas": 2, "router": "round_robin", "tp": 4},
            "output": {"plots": False, "timeseries": False},
            "scheduler": {"enable_chunked_prefill": False},
            "workload": {"max_concurrency": 2, "synthetic": {
                "num_requests": 18, "arrival": {"process": "burst"},
                "prompt_len": {"dist": "fixed", "value": 11},
                "output_len": {"dist": "lognormal", "mean": 100.5, "sigma": 0.8}}}}


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(scenarios())
@example(LEAST_KV)
@example(CLOSED_LOOP)
@example(TIE)
@example(BOUNDARY)
def test_decode_bursts_change_nothing(sc: dict) -> None:
    _same_with_and_without_bursts(sc)


def test_a_step_ends_exactly_at_its_planned_time():
    """0.01934414710799747 + d rounds on a tie for every d near 0.0759...: no timeout from
    there lands on 0.09533127133907739; the replica's own event does."""
    import simpy

    from simulator.cluster.replica import _until

    now, end = 0.01934414710799747, 0.09533127133907739
    env = simpy.Environment(initial_time=now)
    env.timeout(end - now)
    env.run()
    assert env.now != end  # what a timeout gives
    env = simpy.Environment(initial_time=now)
    _until(env, end)
    env.run()
    assert env.now == end
