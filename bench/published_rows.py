"""The published-results suite (bench/published/*.yaml): load and validate its rows, and
turn each row into the kvpd scenario a user could have written from the published setup.

A source file holds `source` (id, title, url, date, kind, engine, engine_version, harness),
`setup` (what every row shares, as published) and `rows` (id, where, setup, metric). A row's
setup is the source setup updated by the row's own. The converter's rules (names, request
counts a source leaves out) live here, once, not per row; each scenario names its engine
(`engine:`), whose documented defaults `simulator.engines` fills in, as for any user's
scenario; `assumptions` records every rule a row needed. A product built on an engine (NIM,
Dynamo) names it as `engine_backend`; its own `engine_version` is then the product's, so the
engine's version comes from `engine_backend_version` (the source's, or a row setup's); a
source that ran one engine in several versions names each row's in its setup's
`engine_version`. A source that states no engine version is run on the engine's newest release
at the source's date (`release_at`, from PyPI's upload dates in
bench/releases/engine_releases.json), or, with no date either, on kvpd's defaults for the
engine as released now.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from simulator.cost.hardware import device_alias
from simulator.engines import apply_engine
from simulator.engines.version import parse_version

SUITE_DIR = Path(__file__).resolve().parent / "published"
RELEASES_FILE = Path(__file__).resolve().parent / "releases" / "engine_releases.json"

SOURCE_KEYS = ("id", "title", "url", "date", "kind", "engine", "engine_version", "harness")
ROW_KEYS = ("id", "where", "setup", "metric")
METRIC_KEYS = ("name", "stat", "unit", "value")
SETUP_REQUIRED = ("model", "hardware", "precision", "tp", "input_len", "output_len")

# Held out to check kvpd against (issue 30): never a source of this suite.
HELD_OUT = {
    "TensorRT-LLM perf-overview tables": ("perf-overview", "perf_overview"),
    "MLPerf Inference Llama-2-70B results": ("mlcommons", "mlperf"),
    "Mooncake docs' PD table": ("kvcache-ai.github.io/mooncake", "mooncake/performance"),
}

# Published model names -> kvpd catalog names (instruct/chat fine-tunes share their base
# model's architecture, which is all the cost model reads).
MODEL_NAMES = {
    "llama2-7b": "llama-2-7b",
    "llama2-13b": "llama-2-13b",
    "llama2-70b": "llama-2-70b",
    "meta/llama-3.3-70b-instruct": "llama-3.3-70b",
    "meta-llama/Llama-3.1-405B-Instruct (FP8)": "llama-3.1-405b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",  # the hub's later name of the same repo
    "Meta-Llama/Llama-3.1-70B": "llama-3.1-70b",  # the base model (SGLang's cookbook spelling)
    "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8": "llama-3.1-70b",
    "amd/Llama-3.1-70B-Instruct-FP8-KV": "llama-3.1-70b",
    "amd/Llama-3.1-405B-Instruct-FP8-KV": "llama-3.1-405b",
    # Mixtures of experts. The same rule: a post-trained release or an FP8 export keeps its
    # base model's config.json shapes. DeepSeek-R1 / R1-0528 are DeepseekV3ForCausalLM with
    # DeepSeek-V3's shapes. Qwen3-235B-A22B-Instruct-2507 (and its -FP8 export) is the catalog
    # entry of that release (the first release's shapes, a 262,144-token context). The
    # precision is the row's.
    "deepseek-ai/DeepSeek-R1": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3.2": "deepseek-v3.2",  # V3's shapes with sparse attention
    "nvidia/DeepSeek-R1-0528-FP4-V2": "deepseek-r1-fp4-v2",  # (InferenceX's spelling)
    "Qwen/Qwen3-235B-A22B-Instruct-2507": "qwen3-235b-a22b-2507",
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": "qwen3-235b-a22b-2507",
    "Qwen/Qwen3.5-397B-A17B-FP8": "qwen3.5-397b-a17b",  # the FP8 export of the release
    "Qwen/Qwen3.5-35B-A3B": "qwen3.5-35b-a3b",
    "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8": "qwen3-coder-480b-a35b",  # the FP8 export
    "zai-org/GLM-4.5-Air": "glm-4.5-air",
    "zai-org/GLM-4.6": "glm-4.6",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "openai/gpt-oss-20b": "gpt-oss-20b",
    # Nemotron-H hybrids: NVIDIA's FP8 export keeps the release's config.json shapes
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8": "nemotron-3-nano-30b-a3b",
    # Dense Qwen3 releases (the hub ids of kvpd's catalog entries).
    "Qwen/Qwen3-14B": "qwen3-14b",
    "Qwen/Qwen3-32B": "qwen3-32b",
}

# Published accelerator names -> kvpd catalog names. "H100 80G": NIM's support matrix
# lists its H100 as "SXM/NVLink 80GB". "A100-80G": LMDeploy's (x8) A100-80G node. A device
# name CUDA / ROCm reports ("NVIDIA H100 80GB HBM3") is the catalog's own alias (`_hardware`).
HARDWARE_NAMES = {
    "A100-80G": "a100-80gb-sxm",
    # SGLang's cookbook states no memory: 8-GPU A100 nodes (HGX A100) are mostly the 80 GB
    # SXM part (the 40 GB one streams 1.56 TB/s, not 2.04: decode rows would be ~25% slower)
    "NVIDIA A100 GPU (8x)": "a100-80gb-sxm",
    "H100 80G": "h100-sxm",
    "MI300X": "mi300x",
    "H200": "h200-sxm",
    # GPUStack's lab names its other H200 nodes "NVIDIA H200 SXM"; its single-GPU Qwen3.5 page
    # says "NVIDIA H200" (no NVL part is named anywhere in the lab).
    "NVIDIA H200": "h200-sxm",
    "B200": "b200",
    "B300": "b300",
    # Names that state the form factor exactly.
    "H200 SXM5": "h200-sxm",
    "NVIDIA H200 SXM": "h200-sxm",
    "NVIDIA H100 SXM": "h100-sxm",
    "NVIDIA A100 SXM 80GB": "a100-80gb-sxm",
    # NVIDIA DGX Cloud's H100 instances are DGX H100 systems: eight H100 SXM5 80GB.
    "NVIDIA H100 (DGX Cloud)": "h100-sxm",
}

# How the harness sends its requests: all at t = 0 (`burst`: request rate inf), a new one as
# one ends (`closed_loop`: setup.concurrency streams), or one every 1 / setup.rate s
# (`constant`: guidellm's --profile constant --rate R, with setup.concurrency its cap on the
# requests in flight where the harness has one).
ARRIVALS = ("burst", "closed_loop", "constant")

# The route a harness's client calls, as published (e.g. `--endpoint /v1/chat/completions`)
# -> `api_server.endpoint` (an engine preset prices that route's per-request work).
ENDPOINTS = {"/v1/chat/completions": "chat_completions", "/v1/completions": "completions"}

# A PD pair "inside one node" moves KV over the node's GPU fabric.
SAME_NODE_LINK = {
    "a100-80gb-sxm": "nvlink3",
    "h100-sxm": "nvlink4",
    "h200-sxm": "nvlink4",
    "b200": "nvlink5",
    "mi300x": "infinity-fabric-mi300",
}

# Weight precision as published -> (kvpd `dtype`, `quantization` or None).
PRECISIONS = {
    "fp16": ("fp16", None),
    "bf16": ("bf16", None),
    "fp8": ("fp8", {"method": "fp8"}),
    # OCP MX FP4 on the routed experts only, the rest BF16: gpt-oss's release checkpoints
    # (config.json quantization_config: quant_method mxfp4, modules_to_not_convert: the
    # attention, router, embeddings and LM head)
    "mxfp4-experts": ("fp4", {"method": "mxfp4", "scope": "experts"}),
    # NVFP4 on every linear but the attention's q/k/v projections: NVIDIA's ModelOpt -FP4-v2
    # exports of DeepSeek-R1 (the model card: the v1 export's MLPs and experts, plus "the wo
    # module in attention layers"; ModelOpt leaves the rest of self_attn out)
    "nvfp4-mlp-and-o_proj": ("fp4", {"method": "nvfp4", "scope": "mlp_and_o_proj"}),
}

# Request counts a source leaves out: the harness's own default.
#   vLLM benchmark_throughput.py: --num-prompts default 1000.
#   AIPerf/genai-perf at fixed concurrency (NIM pages): no count published; 10 per
#   concurrent stream (at least 20) keeps the ramp-up and drain a small part of the run.
DEFAULT_REQUESTS = {"benchmark_throughput": 1000}
CLOSED_LOOP_REQUESTS_PER_STREAM = 10
CLOSED_LOOP_MIN_REQUESTS = 20
# ... and what they measure: steady state. Such a run starts with every stream's first request
# sent at once; counted, that wave dominates the mean TTFT of a short run. The NIM page's
# 5000-token rows cannot have counted it: at concurrency 25 the wave queues 25 prefills of about
# 0.4 s each (the page's own concurrency-1 TTFT is 407 ms), and averaging them over 10
# requests per stream would give over 1 s, where the page reports 689 ms. So one request per
# stream runs as warm-up (workload.warmup_requests) and the 10 per stream after it are measured.
CLOSED_LOOP_WARMUP_PER_STREAM = 1

# metric name -> path into kvpd's run summary, and the summary's unit.
METRICS = {
    "output_throughput": (("throughput", "output_tokens_per_s"), "tok/s"),
    "total_throughput": (("throughput", "total_tokens_per_s"), "tok/s"),
    "request_throughput": (("throughput", "requests_per_s"), "req/s"),
    "ttft": (("ttft_s",), "s"),
    "tpot": (("tpot_s",), "s"),
    "itl": (("itl_s",), "s"),
    "e2e": (("e2e_s",), "s"),
    "batch_latency": (("span_s",), "s"),  # a burst's first arrival to its last token
}
STATS = ("mean", "p50", "p90", "p99")
UNIT_SCALE = {"s": 1.0, "ms": 1e-3, "tok/s": 1.0, "req/s": 1.0}


@dataclass
class Row:
    """One published number and the setup it was measured under."""

    source: dict[str, Any]
    id: str
    where: str
    setup: dict[str, Any]
    metric: dict[str, Any]
    file: str
    # with `setup.runs_on_one_server`: the setups of the runs of the same model the source lists
    # before this row's run, in the source's order (the same server's cache holds their prompts)
    earlier_runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.source['id']}/{self.id}"


@dataclass
class Converted:
    """A row as a kvpd scenario mapping, with the rules it needed."""

    row: Row
    scenario: dict[str, Any]
    assumptions: list[str] = field(default_factory=list)
    # files the scenario reads, written beside it: name -> text (a row's request lengths)
    files: dict[str, str] = field(default_factory=dict)


def _fail(where: str, msg: str) -> None:
    raise ValueError(f"{where}: {msg}")


def check_not_held_out(source: dict[str, Any], where: str) -> None:
    text = " ".join(str(source.get(k, "")) for k in ("url", "title")).lower()
    for name, needles in HELD_OUT.items():
        if any(n in text for n in needles):
            _fail(where, f"source {source.get('url')!r} is held out ({name}); it may not be in the suite")


def _check_row(row: dict[str, Any], setup: dict[str, Any], where: str) -> None:
    for k in ROW_KEYS:
        if k not in row:
            _fail(where, f"row lacks {k!r} (a row needs {', '.join(ROW_KEYS)})")
    m = row["metric"]
    for k in METRIC_KEYS:
        if k not in m:
            _fail(where, f"metric lacks {k!r} (a metric needs {', '.join(METRIC_KEYS)})")
    if m["name"] not in METRICS:
        _fail(where, f"metric.name {m['name']!r} unknown; allowed: {', '.join(METRICS)}")
    if m["stat"] not in STATS:
        _fail(where, f"metric.stat {m['stat']!r} unknown; allowed: {', '.join(STATS)}")
    if m["unit"] not in UNIT_SCALE or (METRICS[m["name"]][1] == "s") != (m["unit"] in ("s", "ms")):
        _fail(where, f"metric.unit {m['unit']!r} does not fit metric {m['name']!r}")
    if not isinstance(m["value"], (int, float)) or isinstance(m["value"], bool) or m["value"] <= 0:
        _fail(where, f"metric.value must be a number > 0, got {m['value']!r}")
    for k in SETUP_REQUIRED:
        if setup.get(k) is None:
            _fail(where, f"setup lacks {k!r} (needed: {', '.join(SETUP_REQUIRED)})")


def load_file(path: str | Path) -> list[Row]:
    """The rows of one source file, validated; errors name the file and the row."""
    path = Path(path)
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("source"), dict):
        _fail(str(path), "expected a mapping with 'source', 'setup' and 'rows'")
    source = data["source"]
    for k in SOURCE_KEYS:
        if source.get(k) in (None, ""):
            _fail(f"{path}: source", f"lacks {k!r} (a source needs {', '.join(SOURCE_KEYS)})")
    check_not_held_out(source, f"{path}: source")
    base = data.get("setup") or {}
    rows = data.get("rows") or []
    if not rows:
        _fail(str(path), "has no rows")
    out, seen = [], set()
    runs: dict[Any, list[tuple]] = {}  # model -> its runs' keys, in file order
    run_setups: dict[tuple, dict[str, Any]] = {}
    for i, r in enumerate(rows):
        where = f"{path}: rows[{i}] ({r.get('id') if isinstance(r, dict) else r!r})"
        if not isinstance(r, dict):
            _fail(where, "a row must be a mapping")
        setup = {**base, **(r.get("setup") or {})}
        _check_row(r, setup, where)
        if r["id"] in seen:
            _fail(where, f"duplicate row id {r['id']!r}")
        seen.add(r["id"])
        earlier: list[dict[str, Any]] = []
        if setup.get("runs_on_one_server"):
            missing = [k for k in ("lengths", "num_requests") if setup.get(k) is None]
            if missing:
                _fail(where, f"setup.runs_on_one_server replays the earlier runs' own requests: "
                      f"it needs setup.{' and setup.'.join(missing)}")
            key = tuple(setup.get(k) for k in RUN_KEYS)
            model_runs = runs.setdefault(setup["model"], [])
            if key not in model_runs:
                model_runs.append(key)
                run_setups[key] = setup
            earlier = [run_setups[k] for k in model_runs[:model_runs.index(key)]]
        out.append(Row(source, str(r["id"]), str(r["where"]), setup, dict(r["metric"]), str(path),
                       earlier))
    return out


def load_suite(folder: str | Path = SUITE_DIR) -> list[Row]:
    """Every row of every source file in `folder` (sorted by file name)."""
    files = sorted(Path(folder).glob("*.yaml"))
    if not files:
        raise FileNotFoundError(f"no source files (*.yaml) in {folder}")
    rows: list[Row] = []
    ids: dict[str, str] = {}
    for f in files:
        file_rows = load_file(f)
        sid = file_rows[0].source["id"]
        if sid in ids:
            _fail(str(f), f"source id {sid!r} already used by {ids[sid]}")
        ids[sid] = str(f)
        rows += file_rows
    return rows


def _lookup(table: dict[str, str], name: Any, what: str, row: Row) -> str:
    if name not in table:
        raise ValueError(f"{row.key}: no rule maps the published {what} {name!r} to kvpd; "
                         f"known: {', '.join(map(str, table))}")
    return table[name]


def _hardware(row: Row, name: Any) -> str:
    """The catalog part of a published hardware name: the names above, or a device name CUDA /
    ROCm reports that the catalog lists as a part's alias (hardware.yaml `aliases`)."""
    if name not in HARDWARE_NAMES:
        alias = device_alias(str(name))
        if alias is not None:
            return alias
    return _lookup(HARDWARE_NAMES, name, "hardware", row)


def _num_requests(row: Row, s: dict[str, Any], closed: bool, notes: list[str]) -> int:
    n = s.get("num_requests")
    if n is not None:
        return int(n)
    harness = str(row.source.get("harness", ""))
    for key, count in DEFAULT_REQUESTS.items():
        if key in harness:
            notes.append(f"num_requests not published: {key} default {count}")
            return count
    if closed:
        n = max(CLOSED_LOOP_MIN_REQUESTS, CLOSED_LOOP_REQUESTS_PER_STREAM * int(s["concurrency"]))
        notes.append(f"num_requests not published: {CLOSED_LOOP_REQUESTS_PER_STREAM} per stream = {n}")
        return n
    raise ValueError(f"{row.key}: the request count is neither published nor given by a rule")


@cache
def _releases() -> dict[str, dict[str, str]]:
    return json.loads(RELEASES_FILE.read_text())["engines"]


def release_at(engine: str, date: Any) -> str | None:
    """The newest release of `engine` first uploaded to PyPI on or before `date` (YYYY-MM-DD;
    a date YAML read as one); None for an engine or date the table cannot answer."""
    try:
        day = datetime.date.fromisoformat(str(date)).isoformat()
    except ValueError:  # "unknown", or no date
        return None
    out = [(parse_version(v), v) for v, d in _releases().get(engine, {}).items() if d <= day]
    return max(out)[1] if out else None


def to_scenario(row: Row) -> Converted:
    """The kvpd scenario mapping for `row` (model, precision, hardware, parallelism, policy,
    burst or closed-loop load of fixed lengths)."""
    s, notes = row.setup, []
    engine = row.source.get("engine_backend") or row.source["engine"]
    version = (s.get("engine_backend_version") or row.source.get("engine_backend_version")
               if row.source.get("engine_backend")
               else s.get("engine_version") or row.source.get("engine_version"))
    if version is None or parse_version(version) is None:  # "unknown" or absent: not published
        date = row.source.get("date")
        version = release_at(engine, date)
        notes.append(f"engine version not published: {engine} {version}, the newest release on "
                     f"PyPI at the source's date ({date})" if version else
                     f"engine version not published: kvpd's defaults for {engine}")
    dtype, quant = PRECISIONS[_lookup({k: k for k in PRECISIONS}, s["precision"], "precision", row)]
    arrival = s.get("arrival", "burst")
    if arrival not in ARRIVALS:
        raise ValueError(f"{row.key}: arrival {arrival!r} not supported ({', '.join(ARRIVALS)})")
    closed = arrival == "closed_loop"
    if closed and not s.get("concurrency"):
        raise ValueError(f"{row.key}: a closed loop needs setup.concurrency")
    if arrival == "constant" and not s.get("rate"):
        raise ValueError(f"{row.key}: a constant arrival needs setup.rate (requests/s)")
    n = _num_requests(row, s, closed, notes)
    warmup = s.get("warmup_requests")
    if warmup is not None and s.get("lengths") is not None:
        raise ValueError(f"{row.key}: setup.warmup_requests with setup.lengths: the warm-up is "
                         f"{s['lengths']}'s own")
    if warmup is None and closed and s.get("num_requests") is None and s.get("lengths") is None:
        warmup = CLOSED_LOOP_WARMUP_PER_STREAM * int(s["concurrency"])
        notes.append(f"warm-up not published: {CLOSED_LOOP_WARMUP_PER_STREAM} per stream = "
                     f"{warmup} unmeasured requests first (steady state; see published_rows.py)")
    warmup = int(warmup or 0)
    # the offline entry point when the harness is vLLM's benchmark_throughput.py (the LLM
    # class) or `trtllm-bench throughput` (which sizes its own limits: simulator.engines.trtllm_bench)
    harness = str(row.source.get("harness", ""))
    offline = not closed and ("benchmark_throughput" in harness or "trtllm-bench" in harness)
    workload, files = _load(row, s, n + warmup, notes)
    sc: dict[str, Any] = {
        "name": f"{row.source['id']}--{row.id}",
        "description": f"{row.source['title']} | {row.where}",
        "seed": 0,
        "model": _lookup(MODEL_NAMES, s["model"], "model", row),
        "dtype": dtype,
        "hardware": _hardware(row, s["hardware"]),
        "engine": {"name": engine, **({"version": str(version)} if version else {}),
                   "entry_point": "offline" if offline else "server"},
        "cluster": {"tp": int(s["tp"]), "pp": int(s.get("pp") or 1)},
        "scheduler": {},
        "cache": {},
        "workload": workload,
        "output": {"plots": False, "timeseries": False},
    }
    if quant is not None:
        sc["quantization"] = quant
    if s.get("hf_overrides"):  # engine flags that change the model's config (vLLM's
        # --hf-overrides; SGLang's --mamba-ssm-dtype: the Gated DeltaNet states' dtype)
        sc["hf_overrides"] = dict(s["hf_overrides"])
    if s.get("kv_cache_dtype"):
        sc["cache"]["kv_cache_dtype"] = s["kv_cache_dtype"]
    if s.get("block_size"):
        sc["cache"]["block_size"] = int(s["block_size"])
    if s.get("gpu_memory_utilization"):
        sc["cache"]["gpu_memory_utilization"] = float(s["gpu_memory_utilization"])
    if s.get("free_gpu_memory_fraction"):  # TensorRT-LLM's --kv_cache_free_gpu_mem_fraction
        sc["cache"]["free_gpu_memory_fraction"] = float(s["free_gpu_memory_fraction"])
    if s.get("mem_fraction_static"):  # SGLang's --mem-fraction-static
        sc["cache"]["mem_fraction_static"] = float(s["mem_fraction_static"])
    if s.get("pd"):
        sc["cluster"] = {"pd": _pd(row, s["pd"], sc["hardware"], notes)}
    if s.get("enable_prefix_caching") is not None:  # e.g. SGLang's --disable-radix-cache
        sc["cache"]["enable_prefix_caching"] = bool(s["enable_prefix_caching"])
    if s.get("max_batch"):
        sc["scheduler"]["max_num_seqs"] = int(s["max_batch"])
    if s.get("max_num_batched_tokens") and not s.get("pd"):
        sc["scheduler"]["max_num_batched_tokens"] = int(s["max_num_batched_tokens"])
    if s.get("max_model_len"):
        sc["scheduler"]["max_model_len"] = int(s["max_model_len"])
    if s.get("enable_chunked_prefill") is not None:
        sc["scheduler"]["enable_chunked_prefill"] = bool(s["enable_chunked_prefill"])
    if s.get("scheduler_recv_interval"):  # SGLang's --scheduler-recv-interval
        sc["scheduler"]["recv_interval"] = int(s["scheduler_recv_interval"])
    for key in ("batch_wait_timeout_iters", "batch_wait_max_tokens_ratio"):  # TensorRT-LLM's
        if s.get(key):
            sc["scheduler"][key] = s[key]
    if int(s.get("ep") or 1) > 1:
        _ep(row, s, sc["cluster"], notes)
    if closed or (arrival == "constant" and s.get("concurrency")):  # the harness's cap on
        sc["workload"]["max_concurrency"] = int(s["concurrency"])  # the requests in flight
    if warmup:
        sc["workload"]["warmup_requests"] = warmup
    if s.get("ignore_eos"):  # the harness tells the engine (e.g. --ignore-eos)
        sc["workload"]["ignore_eos"] = True
    if s.get("endpoint") and not offline:
        sc["api_server"] = {"endpoint": _lookup(ENDPOINTS, s["endpoint"], "endpoint", row)}
    try:  # the engine's documented defaults (simulator.engines) for all the source leaves unset
        notes += apply_engine(sc, row.key)
    except ValueError as exc:
        raise ValueError(f"{row.key}: no rule maps the published engine: {exc}") from None
    for section in ("cache", "scheduler"):
        if not sc[section]:
            del sc[section]
    return Converted(row, sc, notes, files)


def _load(row: Row, s: dict[str, Any], n: int, notes: list[str]) -> tuple[dict, dict[str, str]]:
    """The workload of `n` requests sent at t = 0 (or, with `setup.arrival: constant`, one every
    1 / `setup.rate` s), and the files it reads: a synthetic spec of the published lengths, or
    the harness's own requests (`setup.lengths`) as a trace."""
    if s.get("lengths") is not None:
        return _harness_trace(row, s, n, notes)
    arrival = ({"process": "constant", "rate": float(s["rate"])} if s.get("arrival") == "constant"
               else {"process": "burst"})
    return {"synthetic": {"name": row.id, "num_requests": n, "arrival": arrival,
                          "prompt_len": _lengths(row, s, "input_len", notes),
                          "output_len": _lengths(row, s, "output_len", notes)}}, {}


# Harnesses whose random dataset draws each request's lengths from a seeded generator, as
# `setup.lengths` names them: the converter draws the same requests and writes them as the
# scenario's trace (`workload.format: generic_jsonl`).
#   sglang.bench_serving (python -m sglang.bench_serving --dataset-name random; bench_serving.py
#   compute_random_lens / sample_random_requests / benchmark, v0.5.7):
#   - lengths: np.random.seed(--seed, default 1), then for the inputs and then the outputs
#     np.random.randint(max(int(L x r), 1), L + 1, size=num_prompts), r = --random-range-ratio
#     (default 0.0);
#   - prompts: request i's is the i-th ShareGPT prompt of a list shuffled by Python's random
#     seeded alike, repeated or cut to its length, so request i of every run with the same seed
#     shares its first min(lengths) tokens (trace hash ids: i x HASH_STRIDE + block);
#   - warm-up: before the measured requests it sends request 0's prompt for min(its output,
#     32) tokens and waits for it (--warmup-requests 1), so the measured run starts after it
#     (workload.warmup_requests with warmup_drain).
# With `setup.runs_on_one_server`, a run's warm-up also holds every earlier run of the same model
# in the source (each with its own warm-up request): the server's radix cache keeps their
# prompts, and bench_serving does not flush it (only with --flush-cache or in SGLang's CI).
HARNESS_LENGTHS = ("sglang.bench_serving",)
HARNESS_WARMUP_MAX_TOKENS = 32  # bench_serving's warm-up request: min(output_len, 32)
HASH_BLOCK = 16  # tokens per trace hash id
HASH_STRIDE = 1 << 24  # hash id of prompt i's block j: i x stride + j
# the setup keys that tell one run of a source from another
RUN_KEYS = ("model", "input_len", "output_len", "concurrency", "num_requests")


def _harness_draw(row: Row, s: dict[str, Any], n: int) -> tuple[list[int], list[int]]:
    """The `n` requests' (input, output) lengths of setup `s` as `setup.lengths`'s harness draws
    them."""
    import numpy as np

    harness = s["lengths"]
    if harness not in HARNESS_LENGTHS:
        raise ValueError(f"{row.key}: setup.lengths {harness!r} has no rule (known: "
                         f"{', '.join(HARNESS_LENGTHS)})")
    seed, r = int(s.get("lengths_seed", 1)), float(s.get("random_range_ratio", 0.0))
    rs = np.random.RandomState(seed)  # (numpy's global generator after np.random.seed)
    ins, outs = (rs.randint(max(int(int(s[k]) * r), 1), int(s[k]) + 1, size=n).tolist()
                 for k in ("input_len", "output_len"))
    return ins, outs


def _harness_trace(row: Row, s: dict[str, Any], n: int,
                   notes: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The workload and trace file of a run of `setup.lengths`'s harness: its warm-up requests
    (and, with `setup.runs_on_one_server`, the earlier runs on the same server), then its `n`
    measured requests at t = 0. ValueError when the draw does not give the published input
    token total."""
    import json

    ins, outs = _harness_draw(row, s, n)
    want = s.get("published_input_tokens")
    seed = int(s.get("lengths_seed", 1))
    if want is not None and sum(ins) != int(want):
        raise ValueError(f"{row.key}: {s['lengths']}'s lengths (seed {seed}) sum to {sum(ins)} "
                         f"input tokens, the source says {want}")
    notes.append(f"lengths as {s['lengths']} draws them (seed {seed}, random_range_ratio "
                 f"{float(s.get('random_range_ratio', 0.0))}): {sum(ins)} input and {sum(outs)} "
                 "output tokens" + (" (the published input total)" if want is not None else ""))
    warm: list[tuple[int, int, int]] = []  # (prompt index, input, output)
    for run in row.earlier_runs:
        run_ins, run_outs = _harness_draw(row, run, int(run["num_requests"]))
        warm.append((0, run_ins[0], min(run_outs[0], HARNESS_WARMUP_MAX_TOKENS)))
        warm += list(zip(range(len(run_ins)), run_ins, run_outs))
    warm.append((0, ins[0], min(outs[0], HARNESS_WARMUP_MAX_TOKENS)))
    if row.earlier_runs:
        notes.append(f"runs on one server: the {len(row.earlier_runs)} earlier run(s) of this model "
                     f"in the source ({len(warm) - len(row.earlier_runs) - 1} requests) run first, "
                     "unmeasured: request i of every run has the same prompt up to the shorter "
                     "length (same seed), so the radix cache may hold it")
    notes.append(f"warm-up as {s['lengths']} sends it: request 0's prompt for "
                 f"{warm[-1][2]} tokens, finished before the measured requests start "
                 f"(warmup_requests {len(warm)}, warmup_drain)")
    lines = [json.dumps({"kvpd_trace": {"name": row.id, "hash_block_size": HASH_BLOCK}})]
    for i, a, b in warm + list(zip(range(n), ins, outs)):
        ids = [i * HASH_STRIDE + j for j in range(-(-a // HASH_BLOCK))]
        lines.append(json.dumps({"arrival_s": 0, "prompt_len": a, "output_len": b,
                                 "hash_ids": ids}, separators=(",", ":")))
    name = f"{row.id}.trace.jsonl"
    return ({"trace": name, "format": "generic_jsonl", "warmup_requests": len(warm),
             "warmup_drain": True}, {name: "\n".join(lines) + "\n"})


def _lengths(row: Row, s: dict[str, Any], key: str, notes: list[str]) -> dict[str, Any]:
    """A length distribution: `key` tokens fixed, or with `random_range_ratio` r (the
    random-dataset harnesses' --random-range-ratio) uniform on the integers int(r x L)..L,
    as InferenceX's benchmark_serving.py samples them."""
    n = int(s[key])
    r = s.get("random_range_ratio")
    if r is None:
        return {"dist": "fixed", "value": n}
    if not isinstance(r, (int, float)) or isinstance(r, bool) or not 0 < r <= 1:
        raise ValueError(f"{row.key}: setup.random_range_ratio must be in (0, 1], got {r!r}")
    notes.append(f"{key} uniform on {int(n * r)}..{n} (random_range_ratio {r})")
    return {"dist": "uniform", "min": int(n * r), "max": n}


def _ep(row: Row, s: dict[str, Any], cluster: dict[str, Any], notes: list[str]) -> None:
    """cluster.ep from a published expert-parallel size. vLLM's --enable-expert-parallel
    makes the MoE layers' EP group the whole TP x DP group (so ep = tp with DP 1);
    TensorRT-LLM and SGLang name their --ep_size / --ep-size. kvpd runs EP inside the TP group
    (ep dividing tp, attention tensor-parallel): any other split is refused by the loader,
    which names it, rather than mapped to something else here."""
    if s.get("pd"):
        raise ValueError(f"{row.key}: setup.ep with setup.pd: give ep per PD side")
    cluster["ep"] = int(s["ep"])
    notes.append(f"expert parallelism as published: cluster.ep {cluster['ep']} over tp {cluster['tp']}")


def _pd(row: Row, pd: dict[str, Any], hardware: str, notes: list[str]) -> dict[str, Any]:
    """cluster.pd from a published prefill/decode split (replicas x TP per side)."""
    out: dict[str, Any] = {}
    for side in ("prefill", "decode"):
        if side not in pd:
            raise ValueError(f"{row.key}: setup.pd needs {side!r} with replicas and tp")
        out[side] = {"replicas": int(pd[side].get("replicas", 1)), "tp": int(pd[side]["tp"])}
        if pd[side].get("max_num_batched_tokens"):
            notes.append(f"pd.{side}.max_num_batched_tokens {pd[side]['max_num_batched_tokens']} "
                         "has no per-pool key in kvpd; the scenario-wide default applies")
    link = pd.get("link")
    if link == "same node":
        out["link"] = _lookup(SAME_NODE_LINK, hardware, "same-node fabric of", row)
        notes.append(f"PD link inside one node: {out['link']}")
    elif link is not None:
        raise ValueError(f"{row.key}: setup.pd.link {link!r} has no rule (known: 'same node')")
    return out


def predicted_value(row: Row, summary: dict[str, Any]) -> float:
    """The row's metric read from a kvpd run summary, in the row's unit."""
    path, _unit = METRICS[row.metric["name"]]
    v: Any = summary
    for p in path:
        v = v[p]
    if isinstance(v, dict):
        v = v[row.metric["stat"]]
    if v is None:
        raise ValueError(f"{row.key}: the run produced no {row.metric['name']} {row.metric['stat']}")
    return float(v) / UNIT_SCALE[row.metric["unit"]]


def signed_error(predicted: float, published: float) -> float:
    """(predicted - published) / published: +0.10 means kvpd predicts 10% high."""
    return (predicted - published) / published
