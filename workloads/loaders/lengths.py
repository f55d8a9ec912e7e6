"""Length-only tables (e.g. the ShareGPT statistics CSV) with a synthetic arrival process.

CSV with `num_prefill_tokens` (prompt) and `num_decode_tokens` (output); other
columns are ignored. Options: `arrival` (required; an arrival mapping, see
`workloads.arrivals`), `seed` (int, default 0) and `shuffle` (bool, default
False: keep file order). Arrivals start at 0 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from workloads.arrivals import arrival_times, validate_arrival
from workloads.loaders.build import drop_empty_requests, finish_trace
from workloads.loaders.csvread import read_csv_table
from workloads.loaders.fields import Field, column_mapping, reject_options
from workloads.trace import Trace

FORMAT = "lengths"
COLUMNS = {"prompt_len": "num_prefill_tokens", "output_len": "num_decode_tokens"}


def matches(header: list[str]) -> bool:
    return all(c in header for c in COLUMNS.values())


def load(
    path: Path,
    *,
    skip_invalid: bool = False,
    columns: dict[str, str] | None = None,
    name: str | None = None,
    arrival: dict[str, Any] | None = None,
    seed: int = 0,
    shuffle: bool = False,
    **options: Any,
) -> Trace:
    reject_options(FORMAT, options, ("arrival", "seed", "shuffle"))
    if arrival is None:
        raise ValueError(
            f"{path}: the lengths format has no timestamps; give an arrival process, e.g. "
            "arrival={'process': 'poisson', 'rate': 5.0} (CLI: --arrival process=poisson,rate=5)"
        )
    arrival = validate_arrival(arrival)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"lengths: seed must be an integer >= 0, got {seed!r}")
    cols = column_mapping(COLUMNS, columns, FORMAT)
    fields = [
        Field("prompt_len", cols["prompt_len"], "count"),
        Field("output_len", cols["output_len"], "count"),
    ]
    table = read_csv_table(path, fields, fmt=FORMAT, skip_invalid=skip_invalid)
    drop_empty_requests(table)
    order_rng, arrival_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2)
    )
    if shuffle:
        table.take(order_rng.permutation(len(table)))
    table.columns["arrival"] = arrival_times(arrival, arrival_rng, num_requests=len(table))
    return finish_trace(table, name=name or path.stem, unit="s", rebase=False)
