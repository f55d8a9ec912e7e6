"""Mooncake traces (kvcache-ai/Mooncake, FAST'25 release).

JSONL records `{"timestamp": ms, "input_length": tokens, "output_length":
tokens, "hash_ids": [...]}`; each hash id stands for one 512-token block of the
prompt (the Mooncake trace README), the last block possibly partial. Arrival
times are rebased so the first request arrives at 0 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.loaders.build import finish_trace
from workloads.loaders.fields import Field, column_mapping, reject_options
from workloads.loaders.jsonlread import read_jsonl_table
from workloads.trace import Trace

FORMAT = "mooncake"
COLUMNS = {
    "arrival": "timestamp",
    "prompt_len": "input_length",
    "output_len": "output_length",
    "hash_ids": "hash_ids",
}
# Tokens per hash block in the Mooncake FAST'25 traces (per their trace README and
# shared/data/traces/mooncake_synthetic_trace.README.txt: "512-token prefix blocks").
MOONCAKE_BLOCK_SIZE = 512


def matches(first: dict[str, Any]) -> bool:
    return all(c in first for c in ("timestamp", "input_length", "output_length"))


def load(
    path: Path,
    *,
    skip_invalid: bool = False,
    columns: dict[str, str] | None = None,
    name: str | None = None,
    hash_block_size: int = MOONCAKE_BLOCK_SIZE,
    time_unit: str = "ms",
    **options: Any,
) -> Trace:
    """Load a Mooncake JSONL trace; `time_unit` of `timestamp` is ms in the published traces."""
    reject_options(FORMAT, options, ("hash_block_size", "time_unit"))
    cols = column_mapping(COLUMNS, columns, FORMAT)
    fields = [
        Field("arrival", cols["arrival"], "number"),
        Field("prompt_len", cols["prompt_len"], "count"),
        Field("output_len", cols["output_len"], "count"),
        Field("hash_ids", cols["hash_ids"], "ids", required=False),
    ]
    table = read_jsonl_table(path, fields, fmt=FORMAT, skip_invalid=skip_invalid)
    return finish_trace(
        table, name=name or path.stem, unit=time_unit, hash_block_size=int(hash_block_size)
    )
