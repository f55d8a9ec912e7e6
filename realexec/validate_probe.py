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

from realexec.profile import ProfileGrid, Profiler

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
