"""The sweep results table: one row per point (axes, status, error, every summary metric
flattened), written as Parquet and CSV with pyarrow, and read back for reports."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa

LEAD_COLUMNS = ("point", "point_id", "status", "error", "point_wall_s")


def _kind(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    return "other"


def arrow_column(values: list[Any]) -> pa.Array:
    """One column with a single type: bool, int64, float64 or string (mixed -> JSON text)."""
    kinds = {_kind(v) for v in values} - {"null"}
    if kinds == {"bool"}:
        return pa.array(values, type=pa.bool_())
    if kinds == {"int"}:
        return pa.array(values, type=pa.int64())
    if kinds and kinds <= {"int", "float"}:
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    if kinds <= {"str"}:
        return pa.array(values, type=pa.string())
    return pa.array([v if isinstance(v, str) or v is None else json.dumps(v, default=str)
                     for v in values], type=pa.string())


def table_rows(points: list, results: dict[str, dict], axis_columns: list[str]) -> list[dict]:
    """Rows in point order for the points that have a result: axes, status, metrics."""
    rows = []
    for p in points:
        res = results.get(p.point_id)
        if res is None:
            continue
        row: dict[str, Any] = {"point": p.index, "point_id": p.point_id}
        values = {**p.overrides, **p.axes}
        for col in axis_columns:
            row[col] = values.get(col)
        row.update(status=res["status"], error=res["error"], point_wall_s=res["point_wall_s"])
        for k, v in res["metrics"].items():
            row.setdefault(k, v)  # an axis (e.g. slo.ttft_s) keeps its own column
        rows.append(row)
    return rows


def write_table(rows: list[dict], out_dir: Path, stem: str = "results") -> list[Path]:
    """`stem`.parquet and `stem`.csv in `out_dir`; columns are the union over rows."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    table = pa.table({c: arrow_column([r.get(c) for r in rows]) for c in columns}) if rows \
        else pa.table({c: pa.array([], type=pa.string()) for c in LEAD_COLUMNS})
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.parquet", out_dir / f"{stem}.csv"]
    pq.write_table(table, paths[0])
    pacsv.write_csv(table, paths[1])
    return paths


def read_table(path: str | Path) -> dict[str, list]:
    """A results table (Parquet or CSV) as column name -> list of values."""
    path = Path(path)
    if path.suffix == ".csv":
        import pyarrow.csv as pacsv

        return pacsv.read_csv(path).to_pydict()
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pydict()
