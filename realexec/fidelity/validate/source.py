"""What `kvpd validate` validates: scenario files (any that `kvpd simulate` runs) turned into
cases the real engine and the calibrated simulator can both run, every key checked before
anything is measured.

A case is one scenario in one mode: its requests (the scenario's workload after its own
transforms: any trace format kvpd loads, or synthetic traffic), the scheduler and KV-cache
knobs both backends run with (the same number of KV blocks), and the simulator scenario
that mirrors the real engine (the calibrated device and KV link). Keys the validation sets
itself: `hardware` (the calibrated device: absent, or naming it), `dtype` and `model`
(absent: the calibration's), `cluster.pd.link` (the calibration's fitted link), the rate
(`--rates`/`--fractions` replace `workload.target_rate`/`rate_scale`).

Refused, naming the file, key and reason: a model the real engine cannot build (a catalog
entry with no config), a device or dtype other than the calibration's, quantized weights or
a KV-cache dtype other than the model's, tensor or pipeline
parallelism, more than one colocated replica or more than one prefill and one decode worker,
requests longer than the model's context.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import workloads
from realexec.fidelity.validate.plan import MODES, RunKnobs, scenario_dict
from simulator.cost.params import CostParams

# The shipped scenarios `--traces` names (scenarios/validate/NAME.yaml).
SHIPPED_DIR = Path(__file__).resolve().parents[3] / "scenarios" / "validate"
TRACE_KINDS = ("azure", "gamma")
DEFAULT_NUM_GPU_BLOCKS = 512  # when a scenario sets no cache.num_gpu_blocks (CPU: 8192 tokens)


@dataclass
class Case:
    """One scenario validated in one mode."""

    name: str  # scenario name (runs/NAME-MODE/)
    mode: str  # "colocated" or "pd" (one prefill and one decode worker)
    source: str  # the scenario file
    knobs: RunKnobs  # what the real engine runs with (LLM keyword arguments)
    base: workloads.Trace  # the scenario's requests; a run takes its first ones at a rate
    info: dict[str, Any]  # how they were made (reproduction record)
    seed: int

    @property
    def tag(self) -> str:
        return f"{self.name}-{self.mode}"


class ScenarioRefused(ValueError):
    """A scenario the real engine or the calibrated simulator cannot run as written."""


def shipped(kind: str) -> Path:
    """The shipped scenario of a `--traces` name."""
    if kind not in TRACE_KINDS:
        raise ValueError(f"--traces: {kind!r} is not one of {list(TRACE_KINDS)}")
    return SHIPPED_DIR / f"{kind}.yaml"


def _refuse(src: str, key: str, why: str) -> ScenarioRefused:
    return ScenarioRefused(f"{src}: {key}: {why}")


def _check_model(raw: dict[str, Any], src: str, params: CostParams) -> tuple[dict[str, Any], str]:
    from realexec.fidelity.profile.facts import model_identity

    model = raw.get("model", params.model)
    profiled = params.extra.get("model_config")
    if "model" not in raw and isinstance(profiled, dict):  # the calibrated model, as profiled
        model = profiled
    if isinstance(model, str) and not Path(model).is_absolute() and "/" in model:
        model = str(Path(src).parent / model)
    try:
        config, name = model_identity(model)
    except ValueError as exc:
        from simulator.cost.models import list_models

        where = ("a catalog model with no config the real engine can build (no weights, no "
                 "config.json)" if isinstance(model, str) and model in list_models()
                 else str(exc))
        raise _refuse(src, "model", f"{model!r} is {where}; name a built-in model, a config.json "
                      "or a model folder") from None
    if params.model is not None and name != params.model:
        raise _refuse(src, "model", f"{name!r}, but the calibration is for {params.model!r}")
    return config, name


def _check_hardware(spec: Any, key: str, src: str, params: CostParams) -> None:
    """`spec` must be the calibrated device: a name equal to it, or a calibration of it."""
    if spec is None:
        return
    if isinstance(spec, str) and spec == params.device:
        return
    if isinstance(spec, dict) and spec.get("calibration"):
        path = Path(spec["calibration"])
        path = path if path.is_absolute() else Path(src).parent / path
        try:
            other = CostParams.load(str(path))
        except (OSError, ValueError) as exc:
            raise _refuse(src, key, f"cannot read its calibration {path}: {exc}") from None
        if other.device == params.device and other.model == params.model:
            return
        spec = f"a calibration of {other.model!r} on {other.device!r}"
    raise _refuse(src, key, f"{spec!r} is not the calibrated device {params.device!r}: the real "
                  "runs happen on this machine; drop the key (the calibration is used) or name it")


def _check_precision(raw: dict[str, Any], src: str, dtype: str) -> None:
    """Refuses quantized weights and a KV-cache dtype other than the model's: the real engine
    runs the calibration's unquantized `dtype` weights and keeps its KV cache in that dtype,
    so the simulator would be validated on a precision nothing ran."""
    if raw.get("quantization"):
        raise _refuse(src, "quantization", f"{raw['quantization']!r}: the real engine runs the "
                      f"calibration's unquantized {dtype} weights; leave quantization out")
    kv = ((raw.get("cache") or {}).get("kv_cache_dtype"))
    if kv is not None and str(kv).strip().lower() not in ("auto", dtype):
        raise _refuse(src, "cache.kv_cache_dtype", f"{kv!r}: the real engine keeps its KV cache "
                      f"in the model's {dtype}; use auto or {dtype}")


def _knobs(sc, src: str, model_config: dict[str, Any], dtype: str, context: int,
           num_gpu_blocks: int) -> RunKnobs:
    s, c = sc.scheduler, sc.cache
    blocks = c.num_gpu_blocks or num_gpu_blocks
    cpu_blocks = 0
    if c.swap_space_gb > 0:  # the simulator's host pool, in blocks the real engine allocates
        from simulator.cost.models import ModelSpec

        block_bytes = ModelSpec.from_hf_config(model_config).kv_bytes_per_token(dtype) * c.block_size
        cpu_blocks = int(c.swap_space_gb * 1e9 // block_bytes)
    if s.preemption_mode == "swap" and cpu_blocks < 1:
        raise _refuse(src, "cache.swap_space_gb", "preemption_mode swap needs a host pool of at "
                      "least one KV block")
    return RunKnobs(max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                    num_gpu_blocks=blocks, num_cpu_blocks=cpu_blocks, block_size=c.block_size,
                    enable_chunked_prefill=s.enable_chunked_prefill,
                    long_prefill_token_threshold=s.long_prefill_token_threshold,
                    enable_prefix_caching=c.enable_prefix_caching,
                    preemption_mode=s.preemption_mode, policy=s.policy, batching=s.batching,
                    capacity_policy=s.capacity_policy, mixed_batches=s.mixed_batches,
                    first_token_from_decode=s.first_token_from_decode,
                    prompt_allocation=s.prompt_allocation,
                    admission_watermark=s.admission_watermark,
                    append_needs_free_block=s.append_needs_free_block,
                    recv_interval=s.recv_interval,
                    batch_wait_timeout_iters=s.batch_wait_timeout_iters,
                    batch_wait_max_tokens_ratio=s.batch_wait_max_tokens_ratio,
                    max_model_len=context)


def _check_cluster(sc, src: str) -> str:
    """The scenario's mode; refuses what the real engine on this host cannot deploy."""
    cl = sc.cluster
    for key in ("tp", "pp"):
        if getattr(cl, key) != 1:
            raise _refuse(src, f"cluster.{key}", f"{getattr(cl, key)}: the real engine runs no "
                          "tensor or pipeline parallelism (1 only)")
    if cl.pd is None:
        if cl.replicas != 1:
            raise _refuse(src, "cluster.replicas", f"{cl.replicas}: the real colocated engine "
                          "validated here is one engine (1 only)")
        return "colocated"
    for role in ("prefill", "decode"):
        pool = getattr(cl.pd, role)
        for key in ("replicas", "tp", "pp"):
            if getattr(pool, key) != 1:
                raise _refuse(src, f"cluster.pd.{role}.{key}", f"{getattr(pool, key)}: the real PD "
                              "deployment validated here is one prefill and one decode worker "
                              "without parallelism (1 only)")
        if pool.num_gpu_blocks is not None and pool.num_gpu_blocks != sc.cache.num_gpu_blocks:
            raise _refuse(src, f"cluster.pd.{role}.num_gpu_blocks", "the real workers share one "
                          "KV pool size: set cache.num_gpu_blocks instead")
    return "pd"


def _requests(sc, src: str, context: int) -> tuple[workloads.Trace, dict[str, Any]]:
    from simulator.run import build_trace

    try:
        base = build_trace(sc, max_model_len=context)
    except (OSError, ValueError) as exc:
        raise _refuse(src, "workload", str(exc)) from None
    if sc.workload.over_max_len == "clip":  # the prompt is clipped: the output fits the rest
        base = base.replace(output_len=np.maximum(np.minimum(base.output_len, context - base.prompt_len), 1))
    long = int(((base.prompt_len + base.output_len) > context).sum())
    if long:
        raise _refuse(src, "workload", f"{long} of {len(base)} requests are longer (prompt + "
                      f"output) than the model's context of {context} tokens; scale them "
                      "(workload.scale_prompt / scale_output) or set workload.over_max_len: clip")
    if len(base) < 2:
        raise _refuse(src, "workload", f"{len(base)} request(s): a validation needs at least 2")
    if sc.workload.warmup_requests:
        raise _refuse(src, "workload.warmup_requests", f"{sc.workload.warmup_requests}: a "
                      "validation measures every request of both backends at each rate; drop "
                      "the key (it applies to kvpd simulate and kvpd replay)")
    info = {"source": src, "trace": sc.workload.trace and str(sc.resolve(sc.workload.trace)),
            "synthetic": sc.workload.synthetic, "num_requests": len(base),
            "mean_prompt_tokens": float(base.prompt_len.mean()),
            "mean_output_tokens": float(base.output_len.mean()),
            "prefix_hashes": base.hash_ids is not None}
    return base, info


def load_cases(paths: list[Path], params: CostParams, *, overrides: list[str] = (),
               modes: tuple[str, ...] | None = None,
               num_gpu_blocks: int = DEFAULT_NUM_GPU_BLOCKS) -> tuple[list[Case], dict[str, Any], str, str]:
    """Every case of the scenario files `paths` (`overrides`: `--set KEY=VALUE` applied to
    each; `modes`: validate each scenario in these modes instead of its own), the model's
    HF config and name, and the dtype; `ScenarioRefused` naming the first key that fails."""
    from simulator.scenario import apply_overrides, read_scenario_yaml, scenario_from_dict

    if params.model is None or params.device is None:
        raise ValueError(f"{params.source}: names no model/device; write it with kvpd calibrate")
    cases: list[Case] = []
    model: tuple[dict[str, Any], str] | None = None
    cal_dtype = str(params.extra.get("dtype") or "fp32")
    for path in paths:
        src = str(path)
        raw = apply_overrides(read_scenario_yaml(path), list(overrides))
        sc = scenario_from_dict(raw, src, str(Path(path).resolve().parent))
        config, name = _check_model(raw, src, params)
        if model is not None and name != model[1]:
            raise _refuse(src, "model", f"{name!r}, but an earlier scenario has {model[1]!r}")
        model = (config, name)
        if "dtype" in raw and raw["dtype"] != cal_dtype:
            raise _refuse(src, "dtype", f"{raw['dtype']!r}, but the calibration was profiled in "
                          f"{cal_dtype!r}")
        _check_precision(raw, src, cal_dtype)
        _check_hardware(raw.get("hardware"), "hardware", src, params)
        pd = (raw.get("cluster") or {}).get("pd") or {}
        for role in ("prefill", "decode"):
            _check_hardware((pd.get(role) or {}).get("hardware"), f"cluster.pd.{role}.hardware",
                            src, params)
        own = _check_cluster(sc, src)
        from simulator.cost.models import ModelSpec

        context = int(sc.scheduler.max_model_len
                      or ModelSpec.from_hf_config(config).max_position_embeddings)
        knobs = _knobs(sc, src, config, cal_dtype, context, num_gpu_blocks)
        base, info = _requests(sc, src, context)
        for mode in modes or (own,):
            if mode not in MODES:
                raise ValueError(f"mode {mode!r}: expected one of {list(MODES)}")
            if mode == "pd" and not (params.extra.get("links") or {}).get("kv_transfer"):
                raise _refuse(src, "cluster.pd", "the calibration has no kv_transfer link "
                              "fitted; profile with transfers to validate PD")
            cases.append(Case(sc.name, mode, src, knobs, base, info, sc.seed))
    tags = [c.tag for c in cases]
    dup = sorted({t for t in tags if tags.count(t) > 1})
    if dup:
        raise ValueError(f"scenarios share a name and mode ({', '.join(dup)}): give each a "
                         "distinct `name`")
    assert model is not None
    return cases, model[0], model[1], cal_dtype


def case_scenario(case: Case, model_config: dict[str, Any], dtype: str, calibration: Path,
                  params: CostParams, trace_file: Path, serving_loop: bool = True) -> dict[str, Any]:
    """The simulator scenario of `case` with `trace_file`'s requests."""
    sc = scenario_dict(model_config, dtype, calibration, params, case.knobs, case.mode,
                       trace_file, case.seed, serving_loop)
    sc["name"] = case.tag
    return sc
