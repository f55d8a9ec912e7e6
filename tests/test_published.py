"""The published-results suite (bench/published/*.yaml) and its converter (bench/published*.py)."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import published  # noqa: E402
import published_rows as pr  # noqa: E402

from simulator.cost.models import get_model  # noqa: E402
from simulator.engines import presets as engines  # noqa: E402
from simulator.scenario import Scenario, load_scenario, scenario_from_dict  # noqa: E402

# Scenario keys the converter writes that issue 30's other branches add (30-core, 30-cost).
CONTRACT_KEYS = ("capacity_policy", "max_concurrency", "quantization", "kv_cache_dtype", "burst")


@pytest.fixture(scope="module")
def rows():
    return pr.load_suite()


def test_suite_size_and_coverage(rows):
    """Issue 30: >= 40 rows, >= 3 sources, >= 3 accelerator types, TP > 1, PD, latency and throughput rows."""
    assert len(rows) >= 40
    assert len({r.source["id"] for r in rows}) >= 3
    assert len({r.setup["hardware"] for r in rows}) >= 3
    assert any(int(r.setup["tp"]) > 1 and not r.setup.get("pd") for r in rows)
    assert any(r.setup.get("pd") for r in rows)
    names = {r.metric["name"] for r in rows}
    assert {"ttft", "tpot"} <= names and "output_throughput" in names
    latency = [r for r in rows if r.metric["name"] in ("ttft", "tpot")]
    assert all(r.setup.get("concurrency") or r.setup.get("num_requests") for r in latency)


def test_every_row_has_source_date_engine_setup_metric(rows):
    for r in rows:
        for k in pr.SOURCE_KEYS:
            assert r.source.get(k) not in (None, ""), (r.key, k)
        assert r.where and r.metric["value"] > 0
        for k in pr.SETUP_REQUIRED:
            assert r.setup.get(k) is not None, (r.key, k)
        assert r.source["url"].startswith("https://")


def test_no_held_out_source(rows):
    for r in rows:
        pr.check_not_held_out(r.source, r.key)  # raises on a held-out source


@pytest.mark.parametrize("url", [
    "https://nvidia.github.io/TensorRT-LLM/performance/perf-overview.html",
    "https://mlcommons.org/benchmarks/inference-datacenter/",
    "https://kvcache-ai.github.io/Mooncake/performance/sglang-benchmark-results-v1.html",
])
def test_held_out_source_is_refused(tmp_path, url):
    data = yaml.safe_load((pr.SUITE_DIR / "oci_mi300x_405b.yaml").read_text())
    data["source"]["url"] = url
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="held out"):
        pr.load_suite(tmp_path)


@pytest.mark.parametrize("drop", ["where", "metric", "setup"])
def test_row_without_a_field_is_refused_naming_it(tmp_path, drop):
    data = yaml.safe_load((pr.SUITE_DIR / "oci_mi300x_405b.yaml").read_text())
    del data["rows"][0][drop]
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=f"x.yaml: rows\\[0\\].*{drop}"):
        pr.load_suite(tmp_path)


def test_source_without_date_is_refused(tmp_path):
    data = yaml.safe_load((pr.SUITE_DIR / "oci_mi300x_405b.yaml").read_text())
    del data["source"]["date"]
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="lacks 'date'"):
        pr.load_suite(tmp_path)


def test_every_row_converts(rows):
    """Every row maps to a scenario by the converter's rules (names, policy, load shape)."""
    for r in rows:
        c = pr.to_scenario(r)
        sc = c.scenario
        if r.setup.get("lengths"):  # the harness's own requests, warm-up first, as a trace
            wl = sc["workload"]
            assert wl["format"] == "generic_jsonl" and wl["warmup_drain"] is True
            assert len(c.files[wl["trace"]].splitlines()) == 1 + wl["warmup_requests"] + int(
                r.setup["num_requests"])
            assert wl["max_concurrency"] == int(r.setup["concurrency"])
            continue
        syn = sc["workload"]["synthetic"]
        if r.setup.get("arrival") == "constant":  # guidellm --profile constant --rate R
            assert syn["arrival"] == {"process": "constant", "rate": float(r.setup["rate"])}
        else:
            assert syn["arrival"] == {"process": "burst"}
        if r.setup.get("random_range_ratio"):  # uniform lengths, as the harness samples them
            assert syn["prompt_len"]["max"] == int(r.setup["input_len"])
            assert syn["output_len"]["min"] == int(
                r.setup["output_len"] * r.setup["random_range_ratio"])
        else:
            assert syn["prompt_len"]["value"] == int(r.setup["input_len"])
        assert syn["num_requests"] >= 1
        if r.setup.get("arrival") in ("closed_loop", "constant") and r.setup.get("concurrency"):
            assert sc["workload"]["max_concurrency"] == int(r.setup["concurrency"])
        else:
            assert "max_concurrency" not in sc["workload"]
        assert any(a.startswith("capacity_policy") for a in c.assumptions)


def test_capacity_policy_is_the_engines_rule(rows):
    by_engine = {}
    for r in rows:
        engine = r.source.get("engine_backend") or r.source["engine"]
        by_engine.setdefault(engine, set()).add(pr.to_scenario(r).scenario["scheduler"]["capacity_policy"])
    assert by_engine["tensorrt-llm"] == {"guaranteed_no_evict"}
    assert by_engine["vllm"] == {"max_utilization"}


def test_unknown_published_name_is_refused(rows):
    r = rows[0]
    bad = pr.Row(r.source, r.id, r.where, {**r.setup, "hardware": "TPU v9"}, r.metric, r.file)
    with pytest.raises(ValueError, match="hardware 'TPU v9'"):
        pr.to_scenario(bad)


def _runnable_here(sc: dict) -> bool:
    text = yaml.safe_dump(sc)
    have = set(Scenario.model_fields) | set(Scenario.model_fields["scheduler"].annotation.model_fields) \
        | set(Scenario.model_fields["workload"].annotation.model_fields) \
        | set(Scenario.model_fields["cache"].annotation.model_fields)
    return all(k in have or k not in text for k in CONTRACT_KEYS if k != "burst")


def test_written_scenario_is_accepted_by_the_loader(rows, tmp_path):
    """The YAML written per row goes through kvpd's scenario loader (once the contract keys
    of issue 30's other branches are merged; until then the loader must name them)."""
    for r in rows[:: max(1, len(rows) // 12)]:
        c = pr.to_scenario(r)
        path = published.write_scenario(c.scenario, tmp_path, r, c.assumptions, c.files)
        assert path.read_text().startswith(f"# {r.source['title']}")
        if _runnable_here(c.scenario):
            sc = load_scenario(path)
            assert sc.name == c.scenario["name"]
        else:
            with pytest.raises(ValueError) as exc:
                load_scenario(path)
            assert any(k in str(exc.value) for k in CONTRACT_KEYS)


def test_predicted_value_reads_the_summary_in_the_rows_unit(rows):
    r = next(x for x in rows if x.metric["name"] == "ttft" and x.metric["unit"] == "ms")
    summary = {"ttft_s": {"mean": 0.5, "p50": 0.4, "p90": 0.6, "p99": 0.9}}
    assert pr.predicted_value(r, summary) == pytest.approx(500.0)
    r2 = next(x for x in rows if x.metric["name"] == "output_throughput")
    assert pr.predicted_value(r2, {"throughput": {"output_tokens_per_s": 123.0}}) == 123.0


def test_error_arithmetic():
    assert pr.signed_error(110.0, 100.0) == pytest.approx(0.10)
    assert pr.signed_error(70.0, 100.0) == pytest.approx(-0.30)
    r = pr.Row({"id": "a"}, "x", "", {}, {"value": 1}, "")
    r2 = pr.Row({"id": "a"}, "y", "", {}, {"value": 1}, "")
    r3 = pr.Row({"id": "b"}, "z", "", {}, {"value": 1}, "")
    outs = [published.Outcome(r, 1.1, 0.10), published.Outcome(r2, 0.7, -0.30),
            published.Outcome(r3, 1.05, 0.05), published.Outcome(r3, skipped="needs 30-core")]
    s = published.summarize(outs)
    assert s["ran"] == 3 and s["skipped"] == 1
    assert s["median_abs_by_source"] == {"a": pytest.approx(0.20), "b": pytest.approx(0.05)}
    assert s["median_abs"] == pytest.approx(0.10)
    assert s["worst"].row.id == "y"


def test_run_row_end_to_end(rows, tmp_path):
    """The bench runs a row through the loader and simulator.run (or names what is missing)."""
    r = next(x for x in rows if x.key == "oci-mi300x-405b/l31-405b-tp8-latency-b1")
    out = published.run_row(r, tmp_path)
    if _runnable_here(pr.to_scenario(r).scenario):
        assert out.skipped is None, out.skipped
        assert out.predicted > 0 and not out.moe
        assert out.error == pytest.approx(pr.signed_error(out.predicted, 3.53))
    else:
        assert out.predicted is None
        assert any(k in out.skipped for k in CONTRACT_KEYS)


def _publisher(url: str) -> str:
    """The owner of a source: the GitHub account for github.com addresses, else the host."""
    parts = url.split("/")
    return parts[3].lower() if parts[2] == "github.com" else parts[2].lower()


def _is_moe(row: pr.Row) -> bool:
    try:
        return get_model(pr.to_scenario(row).scenario["model"]).is_moe
    except ValueError:  # a dense catalog name another branch adds (Llama-3.1/3.3 before 30-cost)
        return False


def test_moe_rows_coverage(rows):
    """Issue 34: >= 8 MoE rows from >= 2 independent publishers, throughput and latency rows,
    more than one MoE family and accelerator."""
    moe = [r for r in rows if _is_moe(r)]
    assert len(moe) >= 8
    assert len({_publisher(r.source["url"]) for r in moe}) >= 2
    assert len({pr.to_scenario(r).scenario["model"] for r in moe}) >= 2
    assert len({pr.to_scenario(r).scenario["hardware"] for r in moe}) >= 2
    names = {r.metric["name"] for r in moe}
    assert {"ttft", "tpot"} <= names and "total_throughput" in names


def test_moe_release_names_map_to_their_architecture(rows):
    """Post-trained releases and FP8 exports keep the base model's shapes; the precision is the row's."""
    by_name = {r.setup["model"]: pr.to_scenario(r).scenario for r in rows if _is_moe(r)}
    assert by_name["deepseek-ai/DeepSeek-R1"]["model"] == "deepseek-v3"
    assert by_name["deepseek-ai/DeepSeek-R1-0528"]["model"] == "deepseek-v3"
    fp8 = by_name["Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"]
    bf16 = by_name["Qwen/Qwen3-235B-A22B-Instruct-2507"]
    assert fp8["model"] == bf16["model"] == "qwen3-235b-a22b-2507"  # the release's own entry
    first, release = get_model("qwen3-235b-a22b"), get_model("qwen3-235b-a22b-2507")
    assert (first.num_params, first.num_experts) == (release.num_params, release.num_experts)
    assert fp8["quantization"] == {"method": "fp8"} and "quantization" not in bf16


def test_published_batched_token_budget_reaches_the_scheduler(rows):
    # (a published budget no engine defaults to, so that a dropped one would show)
    r = next(x for x in rows if x.setup.get("max_num_batched_tokens") not in (None, 2048, 8192)
             and not x.setup.get("pd"))
    published = int(r.setup["max_num_batched_tokens"])
    assert pr.to_scenario(r).scenario["scheduler"]["max_num_batched_tokens"] == published
    r2 = next(x for x in rows if _is_moe(x) and not x.setup.get("max_num_batched_tokens"))
    c = pr.to_scenario(r2)  # unpublished: the engine's documented default, said in the notes
    assert c.scenario["scheduler"].get("max_num_batched_tokens") in (2048, 8192, 16384, 32768, None)
    assert any(a.startswith("scheduler limits: ") for a in c.assumptions)


def _with(r, source=None, **setup):
    return pr.Row({**r.source, **(source or {})}, r.id, r.where, {**r.setup, **setup}, r.metric, r.file)


def test_vllm_defaults_by_version_gpu_and_entry_point(rows):
    r = next(x for x in rows if x.source["engine"] == "vllm" and not x.setup.get("pd")
             and x.setup.get("arrival", "burst") == "burst")
    v1 = {"engine_version": "0.11.0", "harness": "vllm bench serve"}
    sched = pr.to_scenario(_with(r, v1, hardware="H200", max_batch=None,
                                 max_num_batched_tokens=None)).scenario["scheduler"]
    assert (sched["max_num_seqs"], sched["max_num_batched_tokens"]) == (1024, 8192)
    sched = pr.to_scenario(_with(r, {**v1, "harness": "benchmark_throughput.py"}, hardware="H200",
                                 max_batch=None, max_num_batched_tokens=None)).scenario["scheduler"]
    assert (sched["max_num_seqs"], sched["max_num_batched_tokens"]) == (1024, 16384)
    sched = pr.to_scenario(_with(r, v1, hardware="A100-80G", max_batch=None,
                                 max_num_batched_tokens=None)).scenario["scheduler"]
    assert (sched["max_num_seqs"], sched["max_num_batched_tokens"]) == (256, 2048)
    v0 = {"engine_version": "0.7.3", "harness": "benchmark_throughput.py"}
    sched = pr.to_scenario(_with(r, v0, max_model_len=32768, max_batch=None,
                                 max_num_batched_tokens=None)).scenario["scheduler"]
    assert sched["enable_chunked_prefill"] is False and sched["max_num_batched_tokens"] == 32768
    assert sched["max_num_seqs"] == 256
    published = pr.to_scenario(_with(r, v1, max_batch=64, max_num_batched_tokens=4096))
    assert published.scenario["scheduler"]["max_num_seqs"] == 64
    assert published.scenario["scheduler"]["max_num_batched_tokens"] == 4096


def test_a_products_own_version_is_not_its_engines(rows):
    """Dynamo's vllm-runtime 0.6.1 is not vLLM 0.6.1: with an engine_backend the engine's
    version is engine_backend_version (the row's, else the source's), else the engine's
    release at the source's date."""
    r = next(x for x in rows if x.source.get("engine_backend") == "vllm" and not x.setup.get("pd"))
    product = {"engine_version": "0.6.1", "engine_backend_version": None, "date": "2025-06-01"}
    eng = pr.to_scenario(_with(r, product, engine_backend_version=None)).scenario["engine"]
    assert eng["version"] == "0.9.0.1"  # not 0.6.1: vLLM's newest release on 2025-06-01
    eng = pr.to_scenario(_with(r, product, engine_backend_version="0.20.1")).scenario["engine"]
    assert eng["version"] == "0.20.1"
    plain = next(x for x in rows if x.source["engine"] == "vllm" and not x.source.get("engine_backend"))
    assert pr.to_scenario(plain).scenario["engine"]["version"] == str(plain.source["engine_version"])


def test_a_row_names_its_own_build_where_a_source_ran_several(rows):
    """dstack ran vLLM 0.7.4.dev181 on H200 and a 0.7.3.dev138 ROCm build on MI300X: each row's
    setup names its build, over the source-level string that lists both."""
    ds = [x for x in rows if x.source["id"] == "dstack-deepseek-r1"]
    built = {pr.to_scenario(x).scenario["engine"]["version"] for x in ds}
    assert built == {"0.7.4.dev181+gf35f8e22", "0.7.3.dev138+g21f6ca217"}
    h200 = next(x for x in ds if "H200" in x.setup["hardware"])
    assert pr.to_scenario(h200).scenario["engine"]["version"].startswith("0.7.4.dev181")
    r = _with(h200, h200.source, engine_version=None)  # without it: the source's string
    assert pr.to_scenario(r).scenario["engine"]["version"] == h200.source["engine_version"]


def test_release_at_a_date_is_the_newest_release_uploaded_by_then():
    """From PyPI's upload days (bench/releases/engine_releases.json): the day itself counts,
    pre-releases are not in the table, and what the table cannot answer is None."""
    assert pr.release_at("vllm", "2024-10-14") == "0.6.3"  # uploaded that day
    assert pr.release_at("vllm", "2024-10-13") == "0.6.2"
    assert pr.release_at("vllm", datetime.date(2025, 3, 19)) == "0.8.1"  # a date YAML parsed
    assert pr.release_at("sglang", "2025-12-31") is not None
    assert not any("rc" in v or "dev" in v for v in pr._releases()["tensorrt-llm"])
    for engine, date in (("vllm", "2020-01-01"), ("vllm", "unknown"), ("nvidia-nim", "2025-01-01")):
        assert pr.release_at(engine, date) is None


def test_an_unpublished_version_runs_the_release_at_the_sources_date(rows):
    """A source that states no engine version (or says 'unknown') is run on the engine's
    release at its date, and says so; with no date either, on kvpd's defaults."""
    r = next(x for x in rows if x.source["engine"] == "vllm" and not x.source.get("engine_backend")
             and not x.setup.get("pd"))
    c = pr.to_scenario(_with(r, {"engine_version": "unknown", "date": "2024-10-10"}, max_batch=None))
    assert c.scenario["engine"]["version"] == "0.6.2"
    assert any("vllm 0.6.2, the newest release on PyPI at the source's date" in a
               for a in c.assumptions)
    assert c.scenario["scheduler"]["max_num_seqs"] == 256  # V0's default follows from it
    c = pr.to_scenario(_with(r, {"engine_version": None, "date": "unknown"}))
    assert "version" not in c.scenario["engine"]
    assert any("kvpd's defaults for vllm" in a for a in c.assumptions)


def test_tensorrt_llm_fp8_runs_an_fp8_kv_cache_unless_published(rows):
    r = next(x for x in rows if x.source.get("engine_backend") == "tensorrt-llm")
    assert pr.to_scenario(_with(r, precision="fp8", kv_cache_dtype=None)).scenario["cache"] == {
        "kv_cache_dtype": "fp8"}
    assert "cache" not in pr.to_scenario(_with(r, precision="bf16", kv_cache_dtype=None)).scenario
    stated = pr.to_scenario(_with(r, precision="fp8", kv_cache_dtype="bf16")).scenario
    assert stated["cache"]["kv_cache_dtype"] == "bf16"


def test_published_ep_becomes_cluster_ep(rows):
    r = next(x for x in rows if _is_moe(x))
    ep = pr.Row(r.source, r.id, r.where, {**r.setup, "ep": 8}, r.metric, r.file)
    c = pr.to_scenario(ep)
    assert c.scenario["cluster"]["ep"] == 8 and c.scenario["cluster"]["tp"] == int(r.setup["tp"])
    assert any(a.startswith("expert parallelism") for a in c.assumptions)
    assert "ep" not in pr.to_scenario(r).scenario["cluster"]
    pd = pr.Row(r.source, r.id, r.where, {**ep.setup, "pd": {"prefill": {"tp": 8}, "decode": {"tp": 8}}},
                r.metric, r.file)
    with pytest.raises(ValueError, match="setup.ep with setup.pd"):
        pr.to_scenario(pd)


def test_published_config_overrides_reach_the_model(rows):
    """A flag that changes the model's config (SGLang's --mamba-ssm-dtype bfloat16 on the
    Qwen3.5 rows) becomes the scenario's hf_overrides, and the model the loader builds keeps
    its Gated DeltaNet states in BF16."""
    from simulator.scenario import scenario_from_dict

    r = next(x for x in rows if x.setup.get("hf_overrides"))
    sc = pr.to_scenario(r).scenario
    assert sc["hf_overrides"] == {"mamba_ssm_dtype": "bfloat16"}
    assert scenario_from_dict(sc).model_spec().linear_state_dtype == "bf16"
    bare = pr.Row(r.source, r.id, r.where, {k: v for k, v in r.setup.items()
                                            if k != "hf_overrides"}, r.metric, r.file)
    assert "hf_overrides" not in pr.to_scenario(bare).scenario


def test_moe_row_runs_end_to_end(rows, tmp_path):
    """A BF16 MoE row (no key beyond main's) goes through the loader and the simulator."""
    r = next(x for x in rows if x.key == "gpustack-qwen3-235b-h100/baseline-tp8-bf16-2000-100-total_throughput")
    out = published.run_row(r, tmp_path)
    assert out.skipped is None, out.skipped
    assert out.predicted > 0 and out.moe
    assert out.error == pytest.approx(pr.signed_error(out.predicted, 23858.69))


def test_tensorrt_llm_rows_get_its_documented_scheduler_defaults(rows):
    """TensorRT-LLM schedules whole prompts (no chunked prefill) within max_num_tokens 8192
    unless the source states otherwise; other engines keep their own rules."""
    for r in rows:
        sc = pr.to_scenario(r).scenario
        sched = sc["scheduler"]
        engine = r.source.get("engine_backend") or r.source["engine"]
        if engine == "tensorrt-llm":
            assert sched["enable_chunked_prefill"] is bool(r.setup.get("enable_chunked_prefill"))
            assert sched["max_num_batched_tokens"] == engines.TRTLLM_MAX_NUM_TOKENS
        elif engine == "lmdeploy-turbomind":
            assert "enable_chunked_prefill" not in sched


def test_closed_loop_warmup_as_published_or_one_request_per_stream(rows):
    """A closed-loop row measures steady state: a published warm-up count passes through (the
    measured count stays as published), an unpublished request count gets one warm-up request
    per stream before its 10 measured per stream; burst rows get none."""
    nim = next(x for x in rows if x.source["id"] == "nim-llm-benchmarking"
               and x.setup.get("concurrency") == 25)
    c = pr.to_scenario(nim)
    w = c.scenario["workload"]
    assert (w["warmup_requests"], w["synthetic"]["num_requests"]) == (25, 250 + 25)
    assert any(a.startswith("warm-up not published: 1 per stream = 25") for a in c.assumptions)
    dyn = next(x for x in rows if x.key.startswith("dynamo-gke-llama31-70b/b200"))
    w = pr.to_scenario(dyn).scenario["workload"]
    assert (w["warmup_requests"], w["synthetic"]["num_requests"]) == (10, 330)
    burst = next(x for x in rows if x.setup.get("arrival", "burst") == "burst")
    assert "warmup_requests" not in pr.to_scenario(burst).scenario["workload"]


def test_random_range_ratio_gives_the_harness_uniform_lengths(rows):
    """A source that samples lengths uniformly (--random-range-ratio r) gets kvpd's uniform
    distribution on int(r x L)..L for both lengths; a ratio outside (0, 1] is refused naming it."""
    row = next(x for x in rows if x.source["id"] == "inferencex-dsr1-h200-sglang")
    c = pr.to_scenario(row)
    syn = c.scenario["workload"]["synthetic"]
    assert syn["prompt_len"] == {"dist": "uniform", "min": 819, "max": 1024}
    assert syn["output_len"] == {"dist": "uniform", "min": 819, "max": 1024}
    assert any("uniform on 819..1024" in a for a in c.assumptions)
    assert "warmup_requests" not in c.scenario["workload"]  # the harness's warm-up ran before
    bad = pr.Row(row.source, row.id, row.where, {**row.setup, "random_range_ratio": 1.5},
                 row.metric, row.file)
    with pytest.raises(ValueError, match="random_range_ratio must be in"):
        pr.to_scenario(bad)


def test_sglang_bench_serving_requests_are_the_harness_draw(rows, tmp_path):
    """`setup.lengths: sglang.bench_serving`: each request's lengths as the harness draws them
    (numpy seeded with --seed 1, uniform on 1..L at --random-range-ratio 0), written beside the
    scenario as its trace; the draw must give the block's published input total. Before them,
    drained: the earlier runs of the model on the same server, then the run's own warm-up request
    (request 0's prompt, at most 32 tokens out); request i of every run shares its prompt's hash
    ids up to the shorter length (same seed: the same ShareGPT prompt)."""
    import json

    row = next(x for x in rows if x.key == "sglang-cookbook/qwen3-8k1k-c16-ttft")
    assert [(e["input_len"], e["output_len"], e["concurrency"]) for e in row.earlier_runs] == [
        (1000, 1000, 1), (1000, 1000, 16), (1000, 1000, 100), (1000, 8000, 1), (1000, 8000, 16),
        (1000, 8000, 64), (8000, 1000, 1)]
    c = pr.to_scenario(row)
    wl = c.scenario["workload"]
    assert "synthetic" not in wl and wl["format"] == "generic_jsonl" and wl["max_concurrency"] == 16
    (name, text), = c.files.items()
    assert wl["trace"] == name
    meta, *recs = [json.loads(x) for x in text.strip().splitlines()]
    assert meta == {"kvpd_trace": {"name": row.id, "hash_block_size": 16}}
    earlier = 10 + 80 + 500 + 10 + 80 + 320 + 10
    assert wl["warmup_requests"] == earlier + 7 + 1 and wl["warmup_drain"] is True
    warm, measured = recs[:wl["warmup_requests"]], recs[wl["warmup_requests"]:]
    assert len(measured) == 80 and all(r["arrival_s"] == 0 for r in recs)
    ins = [r["prompt_len"] for r in measured]
    assert sum(ins) == 300020 and all(1 <= i <= 8000 for i in ins)  # the page's total
    assert all(1 <= r["output_len"] <= 1000 for r in measured)
    assert warm[-1]["prompt_len"] == ins[0] and warm[-1]["output_len"] == min(
        measured[0]["output_len"], 32)  # bench_serving's warm-up request
    assert warm[-1]["hash_ids"] == measured[0]["hash_ids"]
    c1 = warm[-11:-1]  # the 8k/1k run at concurrency 1: the first 10 of the same draw
    assert [r["prompt_len"] for r in c1] == ins[:10]
    assert [r["hash_ids"] for r in c1] == [r["hash_ids"] for r in measured[:10]]
    first = warm[1]  # request 0 of the page's first run (1k/1k): a prefix of request 0's prompt
    n = min(len(first["hash_ids"]), len(measured[0]["hash_ids"]))
    assert first["hash_ids"][:n] == measured[0]["hash_ids"][:n]
    assert not set(measured[1]["hash_ids"]) & set(measured[0]["hash_ids"])
    path = published.write_scenario(c.scenario, tmp_path, row, c.assumptions, c.files)
    sc = load_scenario(path)
    assert sc.workload.trace == name and sc.workload.warmup_drain
    bad = pr.Row(row.source, row.id, row.where, {**row.setup, "published_input_tokens": 300021},
                 row.metric, row.file)
    with pytest.raises(ValueError, match="sum to 300020 input tokens, the source says 300021"):
        pr.to_scenario(bad)
    unknown = pr.Row(row.source, row.id, row.where, {**row.setup, "lengths": "aiperf"},
                     row.metric, row.file)
    with pytest.raises(ValueError, match="setup.lengths 'aiperf' has no rule"):
        pr.to_scenario(unknown)
    data = yaml.safe_load((pr.SUITE_DIR / "sglang_cookbook.yaml").read_text())
    del data["setup"]["lengths"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"bad.yaml: rows\[0\] .*runs_on_one_server replays the "
                       r"earlier runs' own requests: it needs setup.lengths"):
        pr.load_file(tmp_path / "bad.yaml")
    twice = pr.Row(row.source, row.id, row.where, {**row.setup, "warmup_requests": 3},
                   row.metric, row.file)
    with pytest.raises(ValueError, match="setup.warmup_requests with setup.lengths: the warm-up "
                                         "is sglang.bench_serving's own"):
        pr.to_scenario(twice)
    alone = pr.Row(row.source, row.id, row.where, row.setup, row.metric, row.file)
    wl = pr.to_scenario(alone).scenario["workload"]  # no earlier runs: the harness warm-up only
    assert wl["warmup_requests"] == 1


def test_a_what_if_override_reaches_every_row_and_is_recorded(rows, tmp_path):
    """`--set` changes the written scenario (and says so in its rules) and the prediction: a
    half-speed tensor core lengthens a prefill-bound row, the published value stays the same."""
    r = next(x for x in rows if x.key == "gpustack-qwen3-14b-h100/baseline-tp1-bf16-2000-100-total_throughput")
    base = published.run_row(r, tmp_path / "base")
    what = "hardware={base: h100-sxm, bf16_tflops_scale: 0.5}"
    half = published.run_row(r, tmp_path / "half", [what])
    assert base.skipped is None and half.skipped is None, (base.skipped, half.skipped)
    assert half.predicted < 0.8 * base.predicted
    assert any(what in a for a in half.assumptions)
    written = (tmp_path / "half" / r.source["id"] / f"{r.id}.yaml").read_text()
    assert f"# rule: what-if --set {what}" in written
    assert yaml.safe_load(written)["hardware"] == {"base": "h100-sxm", "bf16_tflops_scale": 0.5}


def test_summary_splits_dense_and_moe_rows(rows):
    """The bench prints the median |error| and the rows beyond +-30% of dense and MoE models
    apart (issue 34's target is on the MoE rows)."""
    dense = next(x for x in rows if x.source["id"] == "lmdeploy-a100-fp16")
    moe = next(x for x in rows if x.source["id"] == "gpustack-qwen3-235b-h100")
    outs = [published.Outcome(dense, 1.0, 0.05), published.Outcome(dense, 1.0, -0.40),
            published.Outcome(dense, 1.0, 0.10), published.Outcome(moe, 1.0, 0.5, moe=True)]
    kinds = published.summarize(outs)["median_abs_by_kind"]
    assert kinds["dense"] == (pytest.approx(0.10), 3, 1)
    assert kinds["MoE"] == (pytest.approx(0.5), 1, 1)


def test_the_published_route_reaches_the_api_server(rows):
    r = next(x for x in rows if x.source["id"] == "gpustack-qwen3-14b-a100")
    c = pr.to_scenario(r)
    assert c.scenario["api_server"] == {"endpoint": "chat_completions", "preprocess_s": 0.010}
    assert any(a.startswith("api_server.preprocess_s 10 ms: vLLM 0.11.0") for a in c.assumptions)
    plain = pr.to_scenario(_with(r, endpoint="/v1/completions")).scenario
    assert plain["api_server"] == {"endpoint": "completions"}
    offline = pr.to_scenario(_with(r, {"harness": "benchmark_throughput.py"})).scenario
    assert "api_server" not in offline  # the LLM class has no server
    with pytest.raises(ValueError, match="no rule maps the published endpoint '/v2/chat'"):
        pr.to_scenario(_with(r, endpoint="/v2/chat"))


def test_constant_rate_rows_send_one_request_per_interval_under_the_harness_cap(rows, tmp_path):
    """guidellm's `--profile constant --rate R` with its cap on requests in flight: the row's
    scenario sends a request every 1 / R s and never holds more than the cap; a constant
    arrival without a rate is refused."""
    from simulator.run import run_scenario

    r = next(x for x in rows if x.setup.get("arrival") == "constant")
    small = pr.Row(r.source, r.id, r.where, {**r.setup, "num_requests": 40, "rate": 10,
                                             "concurrency": 4}, r.metric, r.file)
    conv = pr.to_scenario(small)
    sc = load_scenario(published.write_scenario(conv.scenario, tmp_path, small, conv.assumptions,
                                                conv.files))
    res = run_scenario(sc, progress=False, keep_requests=True)
    sent = sorted(q.arrival_time for q in res.requests)
    assert len(sent) == 40 and sent[0] == pytest.approx(0.0)
    assert all(b - a >= 0.1 - 1e-9 for a, b in zip(sent, sent[1:]))  # never above the rate
    assert res.summary["load"]["max_in_flight"] == 4  # the cap binds: a request outlasts 4 intervals
    bad = pr.Row(r.source, r.id, r.where, {k: v for k, v in r.setup.items() if k != "rate"},
                 r.metric, r.file)
    with pytest.raises(ValueError, match="constant arrival needs setup.rate"):
        pr.to_scenario(bad)


def test_trtllm_bench_rows_keep_the_engine_limits_their_logs_state(rows):
    """An offline `trtllm-bench` row whose source states the engine's limits runs with them
    (trtllm-bench's own sizing rule fills only what a source leaves out)."""
    r = next(x for x in rows if x.source["id"] == "etched-trtllm-llama31-70b-h100")
    c = pr.to_scenario(r)
    sc = c.scenario
    assert sc["engine"]["entry_point"] == "offline"
    assert (sc["scheduler"]["max_num_seqs"], sc["scheduler"]["max_num_batched_tokens"]) == (2048, 8192)
    assert sc["scheduler"]["enable_chunked_prefill"] is True
    assert sc["cache"] == {"kv_cache_dtype": "fp8", "block_size": 64,
                           "free_gpu_memory_fraction": 0.9}
    # validated as `kvpd simulate` loads it: trtllm-bench's sizing rule leaves them as stated
    # (a stripped copy gets the rule's own limits, so the check can tell them apart)
    run = scenario_from_dict(sc)
    assert (run.scheduler.max_num_seqs, run.scheduler.max_num_batched_tokens) == (2048, 8192)
    assert not any(n.startswith("scheduler limits:") for n in run.engine_notes)
    bare = {**sc, "scheduler": {"enable_chunked_prefill": True}}
    sized = scenario_from_dict(bare)
    assert any(n.startswith("scheduler limits: trtllm-bench") for n in sized.engine_notes)
    assert (sized.scheduler.max_num_seqs, sized.scheduler.max_num_batched_tokens) != (2048, 8192)
