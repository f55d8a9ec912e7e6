"""`SpeedProbe`: re-time a few profile points just before a rate's real runs, so a
validation reports how fast the machine is *now* relative to the calibration.

Shared machines drift: on the 2-core VM kvpd is checked on, the same 512-token prompt step
took 278 ms and, twenty minutes later, 314 ms, with nothing else running. A validation takes
an hour or more after its profile, so part of its error is this drift, not the simulator.
The probe runs a short and a long prompt step and one decode step in its own small engine
(the real engine is idle meanwhile) and compares them with the calibrated cost model:
speed = predicted total / measured total (< 1: the machine is slower than when profiled).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import workloads
from realexec.fidelity.profile.profiler import ProfileGrid, Profiler

PROBE_GRID = ProfileGrid(prefill_lens=(128, 512), chunks=(), decode_batches=(8,),
                         decode_contexts=(384,), mixed_batches=(), mixed_contexts=(),
                         mixed_prompts=(), ragged=(), swap_blocks=(), transfer_tokens=(),
                         warmup=1, repeats=3)


def probe_grid(max_model_len: int) -> ProfileGrid:
    """`PROBE_GRID` shrunk to fit a model of `max_model_len` tokens."""
    cap = max(8, max_model_len // 2)
    return dataclasses.replace(PROBE_GRID,
                               prefill_lens=tuple(sorted({min(n, cap) for n in PROBE_GRID.prefill_lens})),
                               decode_contexts=(min(384, cap),))


class SpeedProbe:
    def __init__(self, model_config: dict[str, Any], dtype: str, device: str | None,
                 cost_model, seed: int = 0) -> None:
        max_len = int(model_config.get("max_position_embeddings") or 2048)
        self.profiler = Profiler(model_config, dtype, device, probe_grid(max_len), seed)
        self.cost_model = cost_model
        self.device_type = self.profiler.llm.device.type

    def measure(self) -> dict[str, Any]:
        """{"speed": predicted / measured over the probe's steps, "points": [...]}."""
        rows = self.profiler.steps()
        points = []
        for r in rows:
            measured = r.stats()["median_s"]
            points.append({"kind": r.kind, "tokens": r.shape.num_tokens,
                           "measured_s": measured,
                           "predicted_s": self.cost_model.step_time(r.shape)})
        total_m = sum(p["measured_s"] for p in points)
        total_p = sum(p["predicted_s"] for p in points)
        return {"speed": total_p / total_m if total_m > 0 else None, "points": points}


# ----------------------------------------------------------------------------- serving probe
# The isolated probe above re-times single steps in a small engine of its own; real serving
# steps ran 3-8% (colocated) and 6-20% (PD prefill worker) slower than it predicted on the
# 2-core VM. The serving probe instead replays a short fixed load through the validation's own
# real engine (the same process, KV pool, client and, for PD, both workers at once) just
# before each run, and prices the steps it ran with the calibrated cost model.
SERVING_PROBE_RATE = 4.0  # requests/s
SERVING_PROBE_OUTPUT = (16, 64)  # output tokens, uniform


def serving_probe_trace(num_requests: int, context: int, seed: int):
    """The serving probe's load: `num_requests` Poisson arrivals at `SERVING_PROBE_RATE`,
    prompts uniform in [16, context / 4] tokens, outputs uniform in `SERVING_PROBE_OUTPUT`
    (capped to fit `context`); fixed by `seed`, so every probe of a validation is the same."""
    hi = max(2, context // 4)
    out_lo, out_hi = (min(v, max(1, context - hi)) for v in SERVING_PROBE_OUTPUT)
    return workloads.synthesize({
        "name": "serving-probe", "num_requests": int(num_requests),
        "arrival": {"process": "poisson", "rate": SERVING_PROBE_RATE},
        "prompt_len": {"dist": "uniform", "min": min(16, hi), "max": hi},
        "output_len": {"dist": "uniform", "min": out_lo, "max": out_hi}}, seed)
