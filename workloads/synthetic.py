"""`synthesize(spec, seed)`: synthetic traffic from a plain-dict spec (scenarios embed it in YAML).

Spec schema (unknown keys and bad values raise ValueError naming the key):

- `name`: str, default "synthetic"
- `num_requests`: int >= 0, or `duration_s`: seconds > 0 (exactly one of the two)
- `arrival`: mapping, see `workloads.arrivals` (process poisson | gamma | constant |
  piecewise | burst; rate in requests/s; cv; pieces of {duration_s, rate}); `burst` (all at
  t = 0) needs `num_requests`
- `prompt_len`, `output_len`: mappings, see `workloads.distributions` (dist fixed |
  uniform | lognormal | zipf | trace), tokens
- `shared_prefix`: optional mapping, see `workloads.prefix` (num_prefixes, prefix_len,
  fraction, weights, block_size, vocab_size, emit_token_ids); then `prompt_len` is the
  unique suffix after the prefix, and the trace carries `hash_ids` (and token ids)

Example::

    {"num_requests": 1000,
     "arrival": {"process": "gamma", "rate": 5.0, "cv": 4.0},
     "prompt_len": {"dist": "lognormal", "mean": 600, "sigma": 0.8, "min": 1, "max": 4096},
     "output_len": {"dist": "fixed", "value": 128},
     "shared_prefix": {"num_prefixes": 4, "prefix_len": 1024, "fraction": 0.5,
                       "block_size": 16, "vocab_size": 32000}}

Randomness: `seed` (int >= 0) seeds a SeedSequence spawned into independent streams
for arrivals, prompt lengths, output lengths and the shared prefix, so changing one
part of the spec leaves the others' draws unchanged; same spec + seed -> same trace.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workloads.arrivals import MAX_REQUESTS, arrival_times, validate_arrival
from workloads.distributions import draw_lengths, resample_lengths, validate_length
from workloads.prefix import apply_shared_prefix, validate_shared_prefix
from workloads.spec import check_keys, check_mapping, number, require
from workloads.trace import Trace

SPEC_KEYS = (
    "name",
    "num_requests",
    "duration_s",
    "arrival",
    "prompt_len",
    "output_len",
    "shared_prefix",
)


def validate_spec(spec: Any, where: str = "synthesize") -> dict[str, Any]:
    """Checked, normalised copy of a synthesize spec; errors start with `where` (the spec's key
    path, e.g. `workload.synthetic` in a scenario)."""
    spec = check_mapping(spec, where)
    check_keys(spec, SPEC_KEYS, where)
    arrival = spec.get("arrival")
    if isinstance(arrival, dict) and arrival.get("process") == "burst" and "duration_s" in spec:
        raise ValueError(f"{where}.duration_s: arrival process burst puts every request at "
                         "t = 0, so a duration selects none or all; give num_requests instead")
    if ("num_requests" in spec) == ("duration_s" in spec):
        raise ValueError(
            f"{where}: give exactly one of num_requests (int >= 0) and duration_s (s > 0)"
        )
    name = spec.get("name", "synthetic")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.name: expected a non-empty string, got {name!r}")
    return {
        "name": name,
        "num_requests": number(
            spec, "num_requests", where, default=None, lo=0, hi=MAX_REQUESTS, integer=True
        ),
        "duration_s": number(spec, "duration_s", where, default=None, lo=0, lo_open=True),
        "arrival": validate_arrival(
            require(spec, "arrival", where, "an arrival mapping"), f"{where}.arrival"
        ),
        "prompt_len": validate_length(
            require(spec, "prompt_len", where, "a length mapping"), f"{where}.prompt_len"
        ),
        "output_len": validate_length(
            require(spec, "output_len", where, "a length mapping"), f"{where}.output_len"
        ),
        "shared_prefix": (
            validate_shared_prefix(spec["shared_prefix"], f"{where}.shared_prefix")
            if spec.get("shared_prefix") is not None
            else None
        ),
    }


def synthesize(spec: dict[str, Any], seed: int) -> Trace:
    """A seeded synthetic `Trace` from `spec` (schema in the module docstring)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"synthesize: seed must be an integer >= 0, got {seed!r}")
    s = validate_spec(spec)
    arrival_ss, prompt_ss, output_ss, prefix_ss = np.random.SeedSequence(int(seed)).spawn(4)
    arrival = arrival_times(
        s["arrival"],
        np.random.default_rng(arrival_ss),
        num_requests=s["num_requests"],
        duration_s=s["duration_s"],
    )
    n = len(arrival)
    prompt, output = _lengths(
        s, n, np.random.default_rng(prompt_ss), np.random.default_rng(output_ss)
    )
    hashes = tokens = None
    block_size = None
    if s["shared_prefix"] is not None:
        prompt, hashes, tokens = apply_shared_prefix(s["shared_prefix"], prompt, prefix_ss)
        block_size = s["shared_prefix"]["block_size"]
    return Trace(
        arrival_s=arrival,
        prompt_len=prompt,
        output_len=output,
        name=s["name"],
        hash_ids=hashes,
        hash_block_size=block_size,
        prompt_token_ids=tokens,
    )


def _lengths(
    s: dict[str, Any], n: int, prompt_rng: np.random.Generator, output_rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Draw prompt and output lengths; trace resampling of one file is drawn in pairs."""
    p_spec, o_spec = s["prompt_len"], s["output_len"]
    sources: dict[tuple[str, Any], Trace] = {}

    def source(spec: dict[str, Any]) -> Trace:
        from workloads.loaders import load_trace  # local: loaders are heavy (pyarrow)

        key = (spec["path"], spec["format"])
        if key not in sources:
            sources[key] = load_trace(
                spec["path"],
                spec["format"],
                skip_invalid=spec["skip_invalid"],
                columns=spec["columns"],
                **spec["options"],
            )
            if not len(sources[key]):
                raise ValueError(f"{spec['path']}: no requests to resample lengths from")
        return sources[key]

    def draw(spec: dict[str, Any], default_field: str, rng: np.random.Generator, picks: Any = None):
        if spec["dist"] != "trace":
            return draw_lengths(spec, n, rng), None
        src = source(spec)
        if picks is None:
            picks = rng.integers(0, len(src), size=n)
        column = getattr(src, spec["field"] or default_field)
        return resample_lengths(column, spec, picks), picks

    prompt, picks = draw(p_spec, "prompt_len", prompt_rng)
    paired = (
        picks is not None
        and o_spec["dist"] == "trace"
        and (o_spec["path"], o_spec["format"]) == (p_spec["path"], p_spec["format"])
    )
    output, _ = draw(o_spec, "output_len", output_rng, picks if paired else None)
    return prompt, output
