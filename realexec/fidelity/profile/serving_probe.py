"""The serving probe of `kvpd profile`: a short fixed load replayed through a real colocated
engine and a real 1P1D PD deployment, every step they ran recorded, so `kvpd calibrate` can
measure how fast steps run *while serving* relative to the grid's isolated, repeated steps
(`serving_speed` in the calibration; `simulator.calibrate.serving_speed`).

Why: on the 2-core VM kvpd is validated on, the PD prefill worker's steps ran 4-13% slower
in every real PD run than the calibration priced them (after host sharing), and colocated and
decode steps 0-5%, while single steps re-timed in isolation matched it. The grid cannot see
what a serving process does around its steps; a short real load can. The load is
`validate_probe.serving_probe_trace` (synthetic, seeded), not any trace kvpd is validated on.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from simulator.calibrate.loop import encode_loop
from simulator.calibrate.serving_speed import STEP_SHAPE_FIELDS, encode_steps

WARMUP_REQUESTS = 4  # replayed first, not recorded (first-request costs)
MODES = ("colocated", "pd")


def serving_probe(model_config: dict[str, Any], dtype: str, device: str | None,
                  threads: int | None, num_requests: int, seed: int = 0,
                  modes: tuple[str, ...] = MODES, progress=None) -> dict[str, Any]:
    """Replay the serving probe's load through each of `modes`; returns {"num_requests",
    "rate", "shape_fields", "steps": {role: rows (`calibrate_serving.encode_steps`)}, "loop":
    {role: rows (`calibrate_loop.encode_loop`)}, "wall_s": {mode: s}, "errors": {mode: why}}
    (a failed mode is reported, others kept)."""
    import time

    import torch

    import workloads
    from realexec.fidelity.validate.backends import ServedBackend, run_failure
    from realexec.fidelity.validate.plan import RunKnobs
    from realexec.fidelity.validate.speed_probe import SERVING_PROBE_RATE, serving_probe_trace

    say = progress or (lambda _m: None)
    bad = set(modes) - set(MODES)
    if bad:
        raise ValueError(f"serving probe modes {sorted(bad)} unknown; choose from {list(MODES)}")
    if num_requests < 1:
        raise ValueError(f"serving probe needs >= 1 request, got {num_requests}")
    context = int(model_config.get("max_position_embeddings") or 2048)
    trace = serving_probe_trace(num_requests, context, seed)
    warm = workloads.first_n(trace, min(WARMUP_REQUESTS, len(trace)))
    knobs = RunKnobs()
    kw = {**knobs.to_dict(), "dtype": dtype, "device": device, "seed": seed,
          "model_seed": seed}
    out: dict[str, Any] = {"num_requests": num_requests, "rate": SERVING_PROBE_RATE,
                           "knobs": knobs.to_dict(), "shape_fields": list(STEP_SHAPE_FIELDS),
                           "steps": {}, "loop": {}, "wall_s": {}, "errors": {}}
    with tempfile.TemporaryDirectory(prefix="kvpd-serving-probe-") as tmp:
        for mode in modes:
            say(f"serving probe: {num_requests} requests at {SERVING_PROBE_RATE:g} req/s, {mode}")
            t0 = time.perf_counter()
            backend = None
            try:
                # worker processes, as `kvpd validate` runs its real engines; the colocated
                # one with the profile's own torch threads, as its grid ran
                if mode == "colocated":
                    backend = ServedBackend(model_config, kw, threads or torch.get_num_threads(),
                                            Path(tmp) / mode, pd=None)
                else:
                    backend = ServedBackend(model_config, kw, threads, Path(tmp) / mode)
                backend.replay(warm, seed + 1)
                res, _, _ = backend.replay(trace, seed)
                why = run_failure(res)
                if why:
                    raise RuntimeError(why)
                for role, steps in backend.steps.items():
                    out["steps"][role] = encode_steps(steps)
                    out["loop"][role] = encode_loop(steps)
            except Exception as exc:  # a probe is a measurement: report it, keep the rest
                out["errors"][mode] = f"{type(exc).__name__}: {exc}"
                say(f"serving probe ({mode}) failed: {out['errors'][mode]}")
            finally:
                if backend is not None:
                    backend.close()
            out["wall_s"][mode] = time.perf_counter() - t0
    return out
