"""Scenario loading, overrides and bad input; `kvpd simulate` end to end."""

import json

import pytest
import yaml

from kvpd.cli import main
from simulator.run import run_scenario
from simulator.scenario import load_scenario, scenario_from_dict, scenario_keys
from tests.sim_helpers import BASE, merged


def _write(tmp_path, data, name="s.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_unknown_key_names_file_path_and_close_match(tmp_path):
    p = _write(tmp_path, merged(BASE, {"scheduler": {"max_num_seq": 8}}))
    with pytest.raises(ValueError) as exc:
        load_scenario(p)
    msg = str(exc.value)
    assert str(p) in msg and "scheduler.max_num_seq" in msg and "max_num_seqs" in msg


def test_wrong_type_and_impossible_value(tmp_path):
    with pytest.raises(ValueError, match="scheduler.max_num_seqs"):
        load_scenario(_write(tmp_path, merged(BASE, {"scheduler": {"max_num_seqs": "many"}})))
    with pytest.raises(ValueError, match="cache.gpu_memory_utilization"):
        load_scenario(_write(tmp_path, merged(BASE, {"cache": {"gpu_memory_utilization": 1.5}})))
    with pytest.raises(ValueError, match="cluster.pd.decode.replicas"):
        load_scenario(_write(tmp_path, merged(BASE, {"cluster": {"pd": {"decode": {"replicas": 0}}}})))


def test_set_overrides_any_key(tmp_path):
    p = _write(tmp_path, BASE)
    sc = load_scenario(p, ["scheduler.max_num_seqs=7", "cluster.pd.link=nvlink4", "slo.ttft_s=0.25"])
    assert sc.scheduler.max_num_seqs == 7 and sc.cluster.pd.link == "nvlink4" and sc.slo.ttft_s == 0.25
    with pytest.raises(ValueError, match="KEY.PATH=VALUE"):
        load_scenario(p, ["scheduler.max_num_seqs"])
    # a value that is not YAML (before: a yaml ScannerError traceback) and an empty key part
    # (before: `a..b` was read as `a.b`)
    with pytest.raises(ValueError, match=r"--set 'name=\[a': the value is not valid YAML"):
        load_scenario(p, ["name=[a"])
    for key in ("scheduler..max_num_seqs", ".name", "name."):
        with pytest.raises(ValueError, match="has an empty part"):
            load_scenario(p, [f"{key}=1"])
    assert "scheduler.max_num_batched_tokens" in scenario_keys()


def test_failures_before_simulating():
    with pytest.raises(ValueError, match="weights do not fit"):
        run_scenario(scenario_from_dict(merged(BASE, {"model": "llama-3-70b"})))
    empty = merged(BASE, {"workload": {"synthetic": {"num_requests": 10}, "window_s": [5000, 6000]}})
    with pytest.raises(ValueError, match="no requests"):
        run_scenario(scenario_from_dict(empty))
    with pytest.raises(ValueError, match="unknown|close|Unknown"):
        run_scenario(scenario_from_dict(merged(BASE, {"hardware": "h100-sxmm"})))


def test_kvpd_simulate_writes_files_and_compares(tmp_path, capsys):
    a = _write(tmp_path, merged(BASE, {"name": "a"}), "a.yaml")
    b = _write(tmp_path, merged(BASE, {"name": "b", "scheduler": {"max_num_seqs": 4}}), "b.yaml")
    out = tmp_path / "out"
    rc = main(["simulate", str(a), "--out", str(out), "--compare", str(b), "--set", "output.plots=true"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "TTFT" in text and " a " in text and " b" in text
    summary = json.loads((out / "summary.json").read_text())
    for key in ("requests", "throughput", "ttft_s", "tpot_s", "e2e_s", "slo", "kv", "wall_s"):
        assert key in summary
    assert summary["requests"]["total"] == 200
    for f in ("requests.parquet", "timeseries.parquet", "latency_cdf.png", "replicas.png"):
        assert (out / f).is_file(), f
    assert (out / "compare-b" / "summary.json").is_file()


def test_kvpd_simulate_bad_scenario_exits_2(tmp_path, capsys):
    p = _write(tmp_path, merged(BASE, {"cluster": {"routr": "x"}}))
    assert main(["simulate", str(p)]) == 2
    assert "cluster.routr" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["cluster.router", "cluster.pd.decode.router"])
def test_an_unknown_router_is_refused_with_its_key_path(tmp_path, key):
    """(before: refused only when the cluster was built, with no file or key path)"""
    data = merged(BASE, {"cluster": {"pd": {"prefill": {}, "decode": {}}}}) if ".pd." in key else BASE
    with pytest.raises(ValueError, match=rf"{key}: Input should be 'round_robin'.*'prefix_aware'"):
        load_scenario(_write(tmp_path, data), [f"{key}=least_loaded"])


def test_an_unknown_trace_format_is_refused_with_its_key_and_messages_name_a_key_once(tmp_path):
    """(before: `unknown trace format` with neither file nor key, when the trace loaded; and
    validators' messages read "key: Value error, key: ...")"""
    p = _write(tmp_path, BASE)
    with pytest.raises(ValueError, match=r"workload.format: unknown trace format 'xyz'; "
                                         r"expected one of azure, mooncake") as info:
        load_scenario(p, ["workload.format=xyz"])
    assert str(info.value).startswith(str(p))
    with pytest.raises(ValueError) as info:
        load_scenario(p, ["cache.kv_cache_dtype=fp4"])
    assert "  cache.kv_cache_dtype: 'fp4' is not a KV-cache dtype" in str(info.value)
    assert "Value error" not in str(info.value)


def test_a_max_model_len_past_the_model_context_is_refused(tmp_path):
    """As vLLM refuses it (before: taken, so requests past the model's positions were served)."""
    p = _write(tmp_path, BASE)
    with pytest.raises(ValueError, match=r"scheduler.max_model_len = 100000 exceeds llama-3-8b's "
                                         r"context of 8192 tokens"):
        run_scenario(load_scenario(p, ["scheduler.max_model_len=100000"]))


def test_hf_overrides_lay_config_keys_over_the_model(tmp_path, capsys):
    """vLLM's --hf-overrides: GLM-5's IndexCache pattern (SGLang's cookbook) as a scenario key
    and on `kvpd estimate`; a bad value is refused naming hf_overrides and the field."""
    from simulator.cost.models import get_model, merged_config

    pattern = "FFSFSSSFSSFFFSSSFFFSFSSSSSSFFSFFSFFSSFFFFFFSFFFFFSFFSSSSSSFSFFFSFSSSFSFFSFFSSS"
    sc = scenario_from_dict(merged(BASE, {"model": "zai-org/GLM-5-FP8", "dtype": "fp8",
                                          "hf_overrides": {"index_topk_pattern": pattern}}))
    m = sc.model_spec()
    assert (m.name, m.hf_id, m.num_index_layers) == ("glm-5", "zai-org/GLM-5", pattern.count("F"))
    assert get_model("glm-5").num_index_layers == 0  # the catalog entry itself is untouched
    assert get_model("llama-3-8b", {"max_position_embeddings": 4096}).max_position_embeddings \
        == 4096
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "intermediate_size": 128,
                               "vocab_size": 100, "max_position_embeddings": 512}))
    assert get_model(str(cfg), {"num_hidden_layers": 3}).num_layers == 3
    assert merged_config({"a": 1, "t": {"x": 1, "y": 2}}, {"t": {"y": 3}}) == \
        {"a": 1, "t": {"x": 1, "y": 3}}
    bad = _write(tmp_path, merged(BASE, {"model": "glm-5", "hf_overrides": {
        "index_topk_pattern": "S" + pattern[1:]}}))
    assert main(["simulate", str(bad), "--out", str(tmp_path / "o")]) != 0
    err = capsys.readouterr().err
    assert f"{bad}: hf_overrides: " in err and "the first 'full'" in err and "got SFSF" in err
    with pytest.raises(ValueError, match="hf_overrides must be a mapping"):
        get_model("glm-5", ["index_topk_pattern"])
