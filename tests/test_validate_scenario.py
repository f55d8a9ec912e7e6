"""The simulator scenario that mirrors a real validation run."""

from realexec.fidelity.validate.plan import RunKnobs, scenario_dict
from simulator.cost.params import CostParams
from simulator.scenario import scenario_from_dict
from tests.sim_helpers import TINY_HF_CONFIG


def test_pd_scenario_counts_the_first_token_at_hand_off_like_the_real_front_end(tmp_path):
    params = CostParams()
    params.extra["links"] = {"kv_transfer": {"name": "zmq-ipc", "bandwidth_gb_s": 1.5, "latency_us": 200.0}}
    cfg = TINY_HF_CONFIG
    knobs = RunKnobs(num_gpu_blocks=77)
    sc = scenario_dict(cfg, "fp32", tmp_path / "cal.yaml", params, knobs, "pd", tmp_path / "t.csv")
    assert sc["cluster"]["pd"]["first_token"] == "prefill"
    assert sc["cache"]["num_gpu_blocks"] == 77
    parsed = scenario_from_dict(sc)
    assert parsed.cluster.pd.first_token == "prefill"
    colo = scenario_dict(cfg, "fp32", tmp_path / "cal.yaml", params, knobs, "colocated", tmp_path / "t.csv")
    assert "cluster" not in colo


def test_pd_scenario_shares_the_host_memory_the_profile_measured(tmp_path):
    """The real 1P1D workers are two processes on one host: the simulated pools share its
    memory bandwidth at the share the profile measured (no measurement: separate devices)."""
    params = CostParams()
    params.extra["links"] = {"kv_transfer": {"name": "zmq-ipc", "bandwidth_gb_s": 1.5, "latency_us": 200.0}}
    cfg = TINY_HF_CONFIG
    args = (cfg, "fp32", tmp_path / "cal.yaml", params, RunKnobs())
    assert "host_memory_share" not in scenario_dict(*args, "pd", tmp_path / "t.csv")["cluster"]
    params.extra["device_facts"] = {"mem_bw_share": 0.63}
    sc = scenario_dict(*args, "pd", tmp_path / "t.csv")
    assert scenario_from_dict(sc).cluster.host_memory_share == 0.63
    assert "cluster" not in scenario_dict(*args, "colocated", tmp_path / "t.csv")
    # shares fitted from the profile's contended steps win over the two-stream measurement
    params.extra["host_sharing"] = {"memory_share": 0.41, "compute_share": 0.95}
    c = scenario_from_dict(scenario_dict(*args, "pd", tmp_path / "t.csv")).cluster
    assert (c.host_memory_share, c.host_compute_share) == (0.41, 0.95)
    # a fit that failed (too few points) falls back to the measurement
    params.extra["host_sharing"] = {"error": "too few"}
    c = scenario_from_dict(scenario_dict(*args, "pd", tmp_path / "t.csv")).cluster
    assert (c.host_memory_share, c.host_compute_share) == (0.63, None)


def test_an_in_process_engine_is_simulated_without_the_serving_loop(tmp_path):
    """`colocated_engine: inproc` drives an `LLM` in the validating process: no worker loop
    runs between its steps, so its scenario (and a re-scaled copy of it) drops the loop."""
    from realexec.fidelity.validate.plan import rescaled_scenario

    params = CostParams(loop_overhead_s=3e-4, device="cpu")
    args = (TINY_HF_CONFIG, "fp32", tmp_path / "cal.yaml", params, RunKnobs(), "colocated",
            tmp_path / "t.csv")
    assert "serving_loop" not in scenario_dict(*args)["hardware"]
    inproc = scenario_dict(*args, serving_loop=False)
    assert inproc["hardware"]["serving_loop"] is False
    faster = rescaled_scenario(params, inproc, {"engine": 1.1}, tmp_path / "r", "x")
    assert faster["hardware"]["serving_loop"] is False
    assert "serving_loop" not in rescaled_scenario(params, scenario_dict(*args), {"engine": 1.1},
                                                   tmp_path / "r", "y")["hardware"]
