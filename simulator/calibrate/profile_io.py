"""The step-time profile file that `kvpd profile` writes and `kvpd calibrate` reads.

A profile is two files side by side: `NAME.csv`, one row per measured grid point, and
`NAME.json`, the facts needed to interpret it (device, model config, dtype, threads,
library versions, the grid, the seed). Rows:

- step kinds (`prefill`, `chunk`, `decode`, `mixed`): the `BatchShape` of the engine step
  (fields below, tokens) and its wall time (seconds) from schedule to the end of update;
- `linear`: every layer's linears (qkv, o, MLP) alone on `num_tokens` rows; `lm_head`: the
  final norm and LM head on `num_reqs` rows (realexec/fidelity/profile/linears.py);
- `swap_out`, `swap_in`: `num_blocks` KV blocks (`num_bytes`) copied device <-> host;
- `kv_transfer`: the KV of `num_tokens` tokens (`num_bytes`) sent from a prefill worker
  to a decode worker (gather, send, receive, scatter) over the PD transport.

`cpu_median_s`: for one-thread CPU profiles, the median on-CPU time of the engine thread per
step (wall time minus the time other processes held the core; 0 where not measured). With
the profile's `device_facts.cpu_available` (on-CPU / wall over all timed steps) it separates
the model's cost from the machine's contention.

Every row keeps the median of its `repeats` and the spread (`p10_s`, `p90_s`, `min_s`,
`max_s`, `rel_iqr`: interquartile range / median). This module imports neither torch nor
simpy, so the simulator can read profiles without the real executor.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.calibrate.profile_meta import check_profile_meta
from simulator.core.batch_shape import BatchShape

SHAPE_FIELDS = ("num_reqs", "num_tokens", "num_decode_reqs", "decode_context_tokens",
                "num_prefill_reqs", "num_prefill_tokens", "prefill_context_tokens",
                "prefill_attn_pairs", "max_context")
STEP_KINDS = ("prefill", "chunk", "decode", "mixed")
OP_KINDS = ("linear", "lm_head")
COPY_KINDS = ("swap_out", "swap_in", "kv_transfer")
KINDS = STEP_KINDS + OP_KINDS + COPY_KINDS
TIME_FIELDS = ("median_s", "mean_s", "p10_s", "p90_s", "min_s", "max_s", "rel_iqr", "cpu_median_s")
COLUMNS = ("kind", *SHAPE_FIELDS, "num_blocks", "num_bytes", "repeats", *TIME_FIELDS)
INT_COLUMNS = (*SHAPE_FIELDS, "num_blocks", "num_bytes", "repeats")
# Facts a profile's JSON must carry (written by realexec.fidelity.profile.profiler).
REQUIRED_META = ("device", "model", "model_config", "dtype", "device_facts")


@dataclass
class ProfileRow:
    """One grid point: what ran, and the distribution of its measured wall times (s)."""

    kind: str
    shape: BatchShape = field(default_factory=BatchShape)
    num_blocks: int = 0
    num_bytes: int = 0
    times_s: list[float] = field(default_factory=list)
    cpu_times_s: list[float] = field(default_factory=list)  # on-CPU seconds (1-thread CPU runs)

    def stats(self) -> dict[str, float]:
        t = np.asarray(self.times_s, dtype=float)
        if t.size == 0:
            raise ValueError(f"profile row {self.kind}: no timings")
        q10, q25, q50, q75, q90 = np.percentile(t, [10, 25, 50, 75, 90])
        return {"median_s": float(q50), "mean_s": float(t.mean()), "p10_s": float(q10),
                "p90_s": float(q90), "min_s": float(t.min()), "max_s": float(t.max()),
                "rel_iqr": float((q75 - q25) / q50) if q50 > 0 else 0.0,
                "cpu_median_s": float(np.median(self.cpu_times_s)) if self.cpu_times_s else 0.0}

    def to_record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"kind": self.kind}
        rec.update({f: getattr(self.shape, f) for f in SHAPE_FIELDS})
        rec.update(num_blocks=self.num_blocks, num_bytes=self.num_bytes,
                   repeats=len(self.times_s))
        rec.update(self.stats())
        return rec


@dataclass
class Profile:
    """A loaded profile: `rows` as column arrays and `meta` (device facts, model, grid)."""

    columns: dict[str, np.ndarray]
    meta: dict[str, Any]
    path: Path | None = None

    def __len__(self) -> int:
        return len(self.columns["kind"])

    def mask(self, *kinds: str) -> np.ndarray:
        return np.isin(self.columns["kind"], list(kinds))

    def shape(self, i: int) -> BatchShape:
        return BatchShape(**{f: int(self.columns[f][i]) for f in SHAPE_FIELDS})

    @property
    def device(self) -> str:
        return str(self.meta["device"])

    @property
    def model(self) -> str:
        return str(self.meta["model"])


def profile_paths(path: str | Path) -> tuple[Path, Path]:
    """(`NAME.csv`, `NAME.json`) for a path given as either file, or a folder holding
    `profile.csv`."""
    p = Path(path)
    if p.is_dir():
        p = p / "profile.csv"
    if p.suffix == ".json":
        return p.with_suffix(".csv"), p
    if p.suffix != ".csv":
        raise ValueError(f"{path}: a profile is NAME.csv (+ NAME.json) or a folder with profile.csv")
    return p, p.with_suffix(".json")


def write_profile(rows: list[ProfileRow], meta: dict[str, Any], path: str | Path) -> Path:
    """Write `NAME.csv` and `NAME.json`; returns the CSV path."""
    csv_path, json_path = profile_paths(path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow(row.to_record())
    json_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return csv_path


def _text(path: Path) -> str:
    """A profile file's text; ValueError naming it if it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start}); "
                         "`kvpd profile` writes NAME.csv and NAME.json as text") from None


def read_profile(path: str | Path) -> Profile:
    """Read a profile; errors name the file, line and column."""
    csv_path, json_path = profile_paths(path)
    for p in (csv_path, json_path):
        if not p.is_file():
            raise FileNotFoundError(f"profile file not found: {p} (written by `kvpd profile`)")
    try:
        meta = json.loads(_text(json_path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{json_path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{json_path}: expected a JSON object")
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(f"{json_path}: missing field(s) {missing}; expected {list(REQUIRED_META)}")
    check_profile_meta(meta, json_path)
    cols: dict[str, list] = {c: [] for c in COLUMNS}
    with io.StringIO(_text(csv_path), newline="") as f:
        reader = csv.DictReader(f)
        absent = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if absent:
            raise ValueError(f"{csv_path}: missing column(s) {absent}; expected {list(COLUMNS)}")
        for line, rec in enumerate(reader, start=2):
            kind = rec["kind"]
            if kind not in KINDS:
                raise ValueError(f"{csv_path}:{line}: kind {kind!r} is not one of {list(KINDS)}")
            cols["kind"].append(kind)
            for c in COLUMNS[1:]:
                try:
                    v = int(rec[c]) if c in INT_COLUMNS else float(rec[c])
                except (TypeError, ValueError):
                    raise ValueError(f"{csv_path}:{line}: column {c} = {rec[c]!r} is not a number") from None
                if not math.isfinite(v) or v < 0 or (c == "median_s" and not v > 0):
                    raise ValueError(f"{csv_path}:{line}: column {c} = {v} must be a finite "
                                     f"number {'> 0' if c == 'median_s' else '>= 0'}")
                cols[c].append(v)
    arrays = {c: np.asarray(v, dtype=object if c == "kind" else
                            (np.int64 if c in INT_COLUMNS else float)) for c, v in cols.items()}
    return Profile(arrays, meta, csv_path)
