"""The API server in front of an engine (`api_server`, simulator/cluster/api_server.py) and the
vLLM releases that re-parse the chat template per request (simulator/engines/chat_template.py)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator.cluster.api_server import APIServer
from simulator.core.request import Request
from simulator.engines import apply_engine
from simulator.scenario import scenario_from_dict
from tests.sim_helpers import merged, sim

C = 0.01  # seconds per request
BURST = {"workload": {"synthetic": {"num_requests": 60, "arrival": {"process": "burst"},
                                    "prompt_len": {"dist": "fixed", "value": 128},
                                    "output_len": {"dist": "fixed", "value": 4}}}}


def admitted(arrivals: list[float], processes: int = 1, c: float = C) -> list[float]:
    """When each request (sent at `arrivals`) reaches the engine."""
    env = simpy.Environment()
    server = APIServer(env, c, processes)
    out: dict[int, float] = {}

    def send(i: int, t: float):
        yield env.timeout(t)
        req = Request(request_id=str(i), prompt_token_ids=[1] * 8, arrival_time=t)
        server.submit(req, lambda r: out.__setitem__(int(r.request_id), env.now))

    for i, t in enumerate(arrivals):
        env.process(send(i, t))
    env.run()
    return [out[i] for i in range(len(arrivals))]


def test_a_burst_reaches_the_engine_after_every_handler_ran():
    # asyncio runs ready callbacks in order: every handler of the burst before any continuation
    got = admitted([0.0] * 50)
    assert got == pytest.approx([50 * C] * 50)


def test_spread_arrivals_each_wait_their_own_handler():
    arrivals = [i * 3 * C for i in range(20)]  # slower than one handler per C
    assert admitted(arrivals) == pytest.approx([t + C for t in arrivals])


def test_arrivals_faster_than_the_handlers_queue():
    # one every C / 2: the handlers fall behind, and each continuation waits for the handlers
    # that arrived before it finished
    got = admitted([i * C / 2 for i in range(10)])
    assert got == sorted(got)
    assert got[-1] == pytest.approx(10 * C)
    assert all(g >= (i + 1) * C - 1e-12 for i, g in enumerate(got))


def test_processes_share_a_burst_in_turn():
    got = admitted([0.0] * 50, processes=2)
    assert got == pytest.approx([25 * C] * 50)


@pytest.mark.parametrize("bad", [dict(preprocess_s=0.0), dict(preprocess_s=C, processes=0)])
def test_a_server_needs_time_and_a_process(bad):
    with pytest.raises(ValueError, match="API server needs"):
        APIServer(simpy.Environment(), **{"processes": 1, **bad})


def test_simulated_burst_starts_after_the_front_end():
    base = sim(BURST)
    front = sim(merged(BURST, {"api_server": {"preprocess_s": C}}))
    n = 60
    # every request is sent at 0 and scheduled once all 60 handlers ran; the continuations
    # then reach the engine one by one at that instant, so its first step holds the first
    assert np.all(front.records["arrival_s"] == 0.0)
    assert front.records["ttft_s"].min() > n * C
    assert front.records["queueing_s"].min() >= n * C
    one = sim(merged(BURST, {"workload": {"synthetic": {"num_requests": 1}}}))
    assert front.records["ttft_s"].min() == pytest.approx(n * C + one.records["ttft_s"][0])
    extra = front.summary["span_s"] - base.summary["span_s"]
    assert n * C <= extra <= n * C + 2 * one.records["ttft_s"][0]


def test_no_preprocess_time_builds_no_server_and_changes_nothing():
    base = sim(BURST)
    same = sim(merged(BURST, {"api_server": {"endpoint": "chat_completions", "processes": 4}}))
    for key in ("arrival_s", "ttft_s", "e2e_s"):
        np.testing.assert_array_equal(same.records[key], base.records[key])


def test_runs_are_deterministic():
    patch = merged(BURST, {"api_server": {"preprocess_s": C, "processes": 3},
                           "cluster": {"replicas": 2, "router": "least_outstanding_tokens"}})
    a, b = sim(patch), sim(patch)
    np.testing.assert_array_equal(a.records["ttft_s"], b.records["ttft_s"])


def test_routers_see_requests_the_front_end_still_holds():
    # counted at routing, so least-outstanding routing spreads a burst over both replicas
    res = sim(merged(BURST, {"api_server": {"preprocess_s": C},
                             "cluster": {"replicas": 2, "router": "least_outstanding_tokens"}}))
    counts = {}
    for r in res.requests:
        counts[r.annotations["replica"]] = counts.get(r.annotations["replica"], 0) + 1
    assert counts == {"r0": 30, "r1": 30}
    # each replica's own server: 30 handlers before its first request reaches its engine
    assert res.records["ttft_s"].min() > 30 * C


def test_pd_serves_the_prefill_pool_only():
    from simulator.cluster.cluster import SimCluster
    from simulator.cluster.timeline import Timeline

    sc = scenario_from_dict(merged(BURST, {
        "model": "llama-3-8b", "hardware": "h100-sxm", "api_server": {"preprocess_s": C},
        "cluster": {"pd": {"prefill": {"replicas": 2}, "decode": {"replicas": 1},
                           "link": "nvlink4"}}}))
    cluster = SimCluster(simpy.Environment(), sc, sc.model_spec(), Timeline(False), lambda *a: None)
    assert set(cluster.api_servers) == {"p0", "p1"}
    sc = sc.model_copy(update={"api_server": sc.api_server.model_copy(
        update={"pd_route": "prefill_then_decode"})})
    cluster = SimCluster(simpy.Environment(), sc, sc.model_spec(), Timeline(False), lambda *a: None)
    assert set(cluster.api_servers) == {"p0", "p1", "d0"}


PD = {"model": "llama-3-8b", "hardware": "h100-sxm",
      "cluster": {"pd": {"prefill": {"replicas": 2}, "decode": {"replicas": 1}, "link": "nvlink4"}}}


def pd_run(route: str, patch: dict | None = None):
    return sim(merged(merged(BURST, PD), {"api_server": {"preprocess_s": C, "pd_route": route},
                                          **(patch or {})}))


def test_vllms_proxy_route_adds_the_decode_servers_handler_to_ttft():
    one = {"workload": {"synthetic": {"num_requests": 1}}}
    alone, twice = pd_run("prefill", one), pd_run("prefill_then_decode", one)
    # the handler runs after the prefill and before the decode engine pulls the KV
    assert twice.records["ttft_s"][0] == pytest.approx(alone.records["ttft_s"][0] + C)
    r = twice.requests[0]
    assert r.annotations["replicas"] == ["p0", "d0"]
    assert r.annotations["kv_ready_s"] == pytest.approx(alone.requests[0].annotations["kv_ready_s"])


def test_the_decode_server_queues_a_burst_of_prefilled_requests():
    alone, twice = pd_run("prefill"), pd_run("prefill_then_decode")
    busy = twice.summary["api_server"]["busy_fraction"]
    span = twice.summary["sim"]["simulated_s"]
    # the one decode server handled all 60, each prefill server its 30
    assert busy["d0"] == pytest.approx(60 * C / span)
    assert busy["p0"] == pytest.approx(30 * C / span) == busy["p1"]
    assert "d0" not in alone.summary["api_server"]["busy_fraction"]
    # 60 handlers in a row on one loop: the last prefilled request waits for all before it
    assert twice.records["ttft_s"].max() >= alone.records["ttft_s"].max() + C
    assert twice.records["ttft_s"].mean() >= alone.records["ttft_s"].mean() + C
    assert (twice.records["ttft_s"] >= alone.records["ttft_s"].min() + C).all()


def test_the_proxy_route_needs_pd():
    with pytest.raises(ValueError, match=r"api_server.pd_route: prefill_then_decode .*cluster.pd"):
        scenario_from_dict(merged(BURST, {"api_server": {"preprocess_s": C,
                                                         "pd_route": "prefill_then_decode"}}))
    with pytest.raises(ValueError, match="api_server.pd_route"):
        scenario_from_dict(merged(merged(BURST, PD), {"api_server": {"pd_route": "decode"}}))


def test_dp_attention_ranks_share_their_replicas_server():
    from simulator.cluster.cluster import SimCluster
    from simulator.cluster.timeline import Timeline

    sc = scenario_from_dict(merged(BURST, {
        "model": "qwen3-30b-a3b", "hardware": "h100-sxm", "api_server": {"preprocess_s": C},
        "cluster": {"tp": 2, "dp_attention": True}}))
    cluster = SimCluster(simpy.Environment(), sc, sc.model_spec(), Timeline(False), lambda *a: None)
    assert set(cluster.api_servers) == {"r0.dp0", "r0.dp1"}
    assert cluster.api_servers["r0.dp0"] is cluster.api_servers["r0.dp1"]


@pytest.mark.parametrize("api", [{"preprocess_s": C}, {"endpoint": "chat_completions"}])
def test_the_offline_entry_point_has_no_api_server(api):
    with pytest.raises(ValueError, match="offline runs the engine's LLM class"):
        scenario_from_dict(merged(BURST, {"engine": {"name": "vllm", "entry_point": "offline"},
                                          "api_server": api}))


@pytest.mark.parametrize("bad", [{"preprocess_s": -1}, {"processes": 0}, {"endpoint": "chat"}])
def test_bad_api_server_keys_are_refused(bad):
    with pytest.raises(ValueError, match="api_server"):
        scenario_from_dict(merged(BURST, {"api_server": bad}))


# ---- the vLLM preset: per-request chat-template parsing ----

def preset(version: str, endpoint: str | None = "chat_completions", model: str = "qwen3-14b",
           entry: str = "server", **api) -> tuple[dict, list[str]]:
    data = {"model": model, "engine": {"name": "vllm", "version": version, "entry_point": entry}}
    if endpoint is not None or api:
        data["api_server"] = {**({"endpoint": endpoint} if endpoint else {}), **api}
    notes = apply_engine(data)
    return data.get("api_server", {}), [n for n in notes if n.startswith("api_server")]


@pytest.mark.parametrize("version,seconds", [
    ("0.6.4", None), ("0.6.5", 0.004), ("0.7.3", 0.004), ("0.9.1", 0.004), ("0.9.2", None),
    ("0.10.2", None), ("0.11.0", 0.010), ("0.11.1", None), ("0.17.0", None)])
def test_the_versions_that_parse_the_template_per_chat_request(version, seconds):
    api, notes = preset(version)
    assert api.get("preprocess_s") == seconds
    assert bool(notes) == (seconds is not None)


def test_only_the_chat_route_pays():
    api, notes = preset("0.11.0", endpoint="completions")
    assert "preprocess_s" not in api and not notes


def test_an_unsaid_route_is_not_charged_and_the_note_says_how_to_say_it():
    api, notes = preset("0.11.0", endpoint=None)
    assert "preprocess_s" not in api
    assert len(notes) == 1 and "set api_server.endpoint" in notes[0]


def test_harmony_models_skip_the_jinja_template():
    api, notes = preset("0.11.0", model="gpt-oss-20b")
    assert "preprocess_s" not in api and not notes


def test_a_set_value_wins_and_offline_has_no_server():
    api, notes = preset("0.11.0", preprocess_s=0.002)
    assert api["preprocess_s"] == 0.002 and not notes
    data = {"model": "qwen3-14b", "engine": {"name": "vllm", "version": "0.11.0",
                                              "entry_point": "offline"}}
    assert not [n for n in apply_engine(data) if n.startswith("api_server")]
    assert "api_server" not in data


def test_vllm_pd_takes_the_proxy_route_when_its_servers_take_time():
    def notes_for(api: dict, engine: str = "vllm", pd: bool = True) -> tuple[dict, list[str]]:
        data = {"model": "qwen3-14b", "engine": {"name": engine, "version": "0.11.0"},
                "api_server": dict(api)}
        if pd:
            data["cluster"] = {"pd": {"prefill": {}, "decode": {}}}
        notes = apply_engine(data)
        return data["api_server"], [n for n in notes if "pd_route" in n]

    api, notes = notes_for({"endpoint": "chat_completions"})
    assert api["pd_route"] == "prefill_then_decode" and len(notes) == 1
    # nothing to charge (the completions route), a route already said, no PD, not vLLM
    for api_in, engine, pd in (({"endpoint": "completions"}, "vllm", True),
                               ({"endpoint": "chat_completions", "pd_route": "prefill"}, "vllm", True),
                               ({"endpoint": "chat_completions"}, "vllm", False),
                               ({"preprocess_s": C}, "sglang", True)):
        api, notes = notes_for(api_in, engine, pd)
        assert api.get("pd_route", "prefill") == "prefill" and not notes


def test_the_preset_value_runs_end_to_end():
    data = merged(BURST, {"model": "qwen3-14b", "hardware": "a100-80gb-sxm",
                          "engine": {"name": "vllm", "version": "0.11.0"},
                          "api_server": {"endpoint": "chat_completions"}})
    notes = apply_engine(data)
    assert any("0.11.0" in n and "preprocess_s 10 ms" in n for n in notes)
    res = sim(data, base={})
    assert res.records["ttft_s"].min() > 60 * 0.010


def test_the_summary_says_how_busy_each_server_was():
    res = sim(merged(BURST, {"api_server": {"preprocess_s": C, "processes": 2}}))
    front = res.summary["api_server"]
    assert (front["preprocess_s"], front["processes"]) == (C, 2)
    span = res.summary["sim"]["simulated_s"]
    assert front["busy_fraction"] == {"r0": pytest.approx(60 * C / (2 * span))}
    assert "api_server" not in sim(BURST).summary


def test_replicas_split_across_processes_give_the_same_run():
    patch = merged(BURST, {"api_server": {"preprocess_s": C}, "cluster": {"replicas": 2}})
    one, two = sim(patch), sim(merged(patch, {"sim": {"processes": 2}}))
    np.testing.assert_array_equal(np.sort(one.records["ttft_s"]), np.sort(two.records["ttft_s"]))
    assert two.summary["api_server"] == one.summary["api_server"]


def test_sweeps_get_the_servers_busy_fraction_as_mean_and_max():
    from simulator.plan.worker import flatten_summary

    res = sim(merged(BURST, {"api_server": {"preprocess_s": C}, "cluster": {"replicas": 2}}))
    flat = flatten_summary(res.summary)
    busy = res.summary["api_server"]["busy_fraction"]
    assert flat["api_server.busy_fraction.max"] == max(busy.values())
    assert flat["api_server.busy_fraction.mean"] == pytest.approx(sum(busy.values()) / 2)
    assert not any(k.startswith("api_server.busy_fraction.r") for k in flat)


def test_a_check_across_sections_names_its_keys_not_the_whole_scenario(tmp_path):
    from simulator.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text("model: llama-3-8b\nengine: {name: vllm, entry_point: offline}\n"
                    "api_server: {preprocess_s: 0.01}\n")
    with pytest.raises(ValueError) as err:
        load_scenario(path)
    text = str(err.value)
    assert f"{path}: invalid scenario" in text
    assert "  scenario: engine.entry_point: offline runs the engine's LLM class" in text
    assert "'model'" not in text and "Value error" not in text
