"""The serving probe's load: a short fixed load of other requests than the validated ones,
replayed through the validation's own real engine (the same process, KV pool, client and,
for PD, both workers at once) before and after every real run; the steps it ran, priced
with the calibrated cost model, say how fast each engine runs relative to the calibration
(`kvpd validate` brackets each run with them, `realexec.fidelity.validate.validation`).

An isolated probe (a few profile steps re-timed in a small engine of its own) was tried
first and left the product: real serving steps ran 3-8% (colocated) and 6-20% (PD prefill
worker) slower than it predicted on the 2-core VM (docs/validation-runs.md).
"""

from __future__ import annotations

import workloads

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
