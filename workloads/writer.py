"""`write_trace`: save a `Trace` in kvpd's generic format (CSV or JSONL, by extension).

Both keep every column, so `load_trace(write_trace(t, p))` equals `t`:
CSV has `arrival_s,prompt_len,output_len` plus, when present, `session_id`,
`hash_ids` and `prompt_token_ids` (space-separated integers) and
`hash_block_size`; JSONL starts with a `{"kvpd_trace": {...}}` metadata record
(name, hash_block_size, rows) followed by one object per request.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from workloads.loaders.generic import META_KEY
from workloads.ragged import Ragged
from workloads.trace import Trace

CSV_SUFFIXES = (".csv",)
JSONL_SUFFIXES = (".jsonl", ".ndjson")


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write `trace` to `path` (`.csv`, or `.jsonl`/`.ndjson`); returns the path."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in CSV_SUFFIXES:
        _write_csv(trace, path)
    elif suffix in JSONL_SUFFIXES:
        _write_jsonl(trace, path)
    else:
        raise ValueError(
            f"{path}: cannot tell the output format from the extension {suffix!r}; "
            f"expected one of {', '.join(CSV_SUFFIXES + JSONL_SUFFIXES)}"
        )
    return path


def _joined(ragged: Ragged) -> pa.Array:
    """Each row as space-separated integers (vectorised through Arrow)."""
    lists = pa.ListArray.from_arrays(
        pa.array(ragged.offsets.astype(np.int32) if len(ragged.values) < 2**31 else ragged.offsets),
        pa.array(ragged.values).cast(pa.string()),
    )
    return pc.binary_join(lists, " ")


def _write_csv(trace: Trace, path: Path) -> None:
    cols: dict[str, pa.Array] = {
        "arrival_s": pa.array(trace.arrival_s),
        "prompt_len": pa.array(trace.prompt_len),
        "output_len": pa.array(trace.output_len),
    }
    if trace.session_id is not None:
        cols["session_id"] = pa.array(trace.session_id)
    if trace.hash_ids is not None:
        cols["hash_ids"] = _joined(trace.hash_ids)
        cols["hash_block_size"] = pa.array(np.full(len(trace), trace.hash_block_size, np.int64))
    if trace.prompt_token_ids is not None:
        cols["prompt_token_ids"] = _joined(trace.prompt_token_ids)
    pcsv.write_csv(pa.table(cols), path, write_options=pcsv.WriteOptions(quoting_style="needed"))


def _write_jsonl(trace: Trace, path: Path) -> None:
    meta = {"name": trace.name, "rows": len(trace), "hash_block_size": trace.hash_block_size}
    arrival = trace.arrival_s.tolist()
    prompt = trace.prompt_len.tolist()
    output = trace.output_len.tolist()
    session = None if trace.session_id is None else trace.session_id.tolist()
    hashes = _rows(trace.hash_ids)
    tokens = _rows(trace.prompt_token_ids)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps({META_KEY: meta}) + "\n")
        for i in range(len(trace)):
            rec: dict[str, object] = {
                "arrival_s": arrival[i],
                "prompt_len": prompt[i],
                "output_len": output[i],
            }
            if session is not None:
                rec["session_id"] = session[i]
            if hashes is not None:
                rec["hash_ids"] = hashes(i)
            if tokens is not None:
                rec["prompt_token_ids"] = tokens(i)
            fh.write(json.dumps(rec, separators=(", ", ": ")) + "\n")


def _rows(ragged: Ragged | None):  # noqa: ANN202 - returns a row getter or None
    if ragged is None:
        return None
    values = ragged.values.tolist()
    offsets = ragged.offsets.tolist()
    return lambda i: values[offsets[i] : offsets[i + 1]]
