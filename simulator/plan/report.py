"""Reports of sweep and capacity results: a self-contained HTML page (PNG plots embedded
as base64, the results table) or a Markdown summary (PNGs written next to it).

`write_report(path, fmt)` takes a sweep folder (sweep.json + results.parquet), a
capacity folder (capacity.json), or one of those files."""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.plan import plots as plots
from simulator.plan.result_files import CAPACITY, SWEEP_META, read_result_json
from simulator.plan.table import read_table

# Metric columns shown in the report tables (all columns are in results.csv).
TABLE_METRICS = ("slo.goodput_rps", "slo.attainment", "throughput.output_tokens_per_s",
                 "ttft_s.p90", "tpot_s.p90", "e2e_s.p90", "kv.peak_usage", "preemptions",
                 "cost.usd_per_hour", "cost.usd_per_m_output_tokens")
MAX_TABLE_ROWS = 500


@dataclass
class Report:
    """A report as ordered blocks: ("h", text), ("p", text), ("table", (head, rows)),
    ("img", (name, png bytes))."""

    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def h(self, text: str) -> None:
        self.blocks.append(("h", text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, head: list[str], rows: list[list[Any]]) -> None:
        self.blocks.append(("table", (head, rows)))

    def img(self, name: str, png: bytes | None) -> None:
        if png:
            self.blocks.append(("img", (name, png)))


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def locate(path: str | Path) -> tuple[str, Path]:
    """("sweep" | "capacity", results folder) for a folder or a results file."""
    p = Path(path)
    if p.is_file():
        if p.name == "capacity.json":
            return "capacity", p.parent
        if p.suffix in (".parquet", ".csv", ".json", ".jsonl") and (p.parent / "sweep.json").is_file():
            return "sweep", p.parent
        raise FileNotFoundError(f"{p}: not a capacity result (capacity.json) nor a file of a "
                                f"sweep folder (no sweep.json beside it)")
    if p.is_dir():
        if (p / "capacity.json").is_file():
            return "capacity", p
        if (p / "sweep.json").is_file():
            return "sweep", p
    raise FileNotFoundError(f"{p}: not a sweep folder (sweep.json, results.parquet) or a "
                            f"capacity result (capacity.json)")


def sweep_report(folder: Path, metric: str = "slo.goodput_rps") -> Report:
    meta = read_result_json(folder / "sweep.json", SWEEP_META, "kvpd sweep")
    table_path = folder / "results.parquet"
    if not table_path.is_file():
        table_path = folder / "results.csv"
    if not table_path.is_file():
        raise FileNotFoundError(f"{folder}: no results table yet (results.parquet / .csv)")
    cols = read_table(table_path)
    n = len(cols.get("point", []))
    rows = [{k: v[i] for k, v in cols.items()} for i in range(n)]
    if metric not in cols:
        import difflib

        close = difflib.get_close_matches(metric, list(cols), n=3)
        raise ValueError(f"--metric {metric!r} is not a column of {table_path}"
                         + (f"; did you mean {', '.join(close)}?" if close else ""))
    axes = [a["name"] for a in meta["axes"]]
    axis_cols = meta.get("axis_columns", axes)
    ok = [r for r in rows if r.get("status") == "ok"]
    failed = [r for r in rows if r.get("status") != "ok"]
    rep = Report(f"Sweep {meta['name']}")
    rep.p(f"{meta.get('description') or ''} Base scenario {meta['base']}; {meta['mode']} over "
          f"{', '.join(axes)}; {n} of {meta['num_points']} points done, {len(ok)} ok, "
          f"{len(failed)} failed.")
    if ok and metric in cols:
        rep.h(f"Best points by {metric}")
        best = sorted(ok, key=lambda r: -(r.get(metric) or -math.inf))[:10]
        rep.table(axis_cols + list(TABLE_METRICS), [[r.get(c) for c in axis_cols + list(TABLE_METRICS)]
                                                    for r in best])
    rep.h("Plots")
    rep.img("pareto", plots.plot_pareto(rows, axes, metric))
    numeric_axes = [a for a in axes if len(plots.distinct([r.get(a) for r in ok])) >= 2]
    for i, a in enumerate(numeric_axes):
        others = [b for b in numeric_axes if b != a
                  and len(plots.distinct([r.get(b) for r in ok])) <= plots.MAX_GROUPS]
        rep.img(f"lines_{i}", plots.plot_metric_lines(rows, a, others[0] if others else None))
    for i, a in enumerate(numeric_axes):
        for b in numeric_axes[i + 1:]:
            rep.img(f"heatmap_{a}_{b}", plots.plot_heatmap(rows, a, b, metric))
    if failed:
        rep.h(f"Failed points ({len(failed)})")
        rep.table(["point"] + axis_cols + ["error"],
                  [[r["point"]] + [r.get(c) for c in axis_cols] + [r.get("error")] for r in failed])
    rep.h("Results")
    shown = [c for c in ["point"] + axis_cols + ["status"] + list(TABLE_METRICS) if c in cols]
    rep.p(f"Key columns; every summary metric is in {table_path.with_suffix('.csv').name}."
          + (f" First {MAX_TABLE_ROWS} rows." if n > MAX_TABLE_ROWS else ""))
    rep.table(shown, [[r.get(c) for c in shown] for r in rows[:MAX_TABLE_ROWS]])
    return rep


def capacity_report(folder: Path) -> Report:
    res = read_result_json(folder / "capacity.json", CAPACITY, "kvpd capacity")
    rep = Report(f"Capacity {res['name']}")
    rep.p(f"Scenario {res['scenario']}; SLOs: {res['slo_text']}; unit searched: {res['unit']}"
          + (f"; peak {res['peak_rps']:g} req/s" if res.get("peak_rps") else "") + ". "
          f"{res['num_simulations']} simulations in {res['wall_s']:.1f} s. Best: {res['best'] or '-'}."
          + (f" Note: {res['unit_note']}." if res.get("unit_note") else ""))
    head = ["candidate", "status", "max req/s", "req/s per GPU", "GPUs/unit", "USD/h per unit",
            "USD per M output tokens", "units for peak", "GPUs for peak", "USD/h for peak",
            "simulations"]
    keys = ["name", "status", "max_rate_rps", "max_rate_per_gpu", "gpus_per_replica",
            "usd_per_hour_per_replica", "usd_per_m_output_tokens", "replicas_for_peak",
            "gpus_for_peak", "usd_per_hour_for_peak", "num_simulations"]
    rep.h("Candidates")
    rep.table(head, [[c.get(k) for k in keys] for c in res["candidates"]])
    notes = []
    for c in res["candidates"]:
        for n in (c.get("error"), c.get("note"), c.get("cost_note"),
                  (c.get("confidence") or {}).get("note")):
            if n:
                notes.append(f"{c['name']}: {n}")
    if notes:
        rep.h("Notes")
        for n in notes:
            rep.p(n)
    rep.h("Plots")
    for name, png in plots.plot_capacity_curves(res):
        rep.img(name, png)
    rep.img("capacity_bars", plots.plot_capacity_bars(res))
    rep.h("Evaluations")
    cols = ["candidate", "rate (req/s)", "replay", "SLOs met", "why not"]
    rep.table(cols, [[c["name"], e["rate"], e["variant"], e["ok"], "; ".join(e["reasons"])]
                     for c in res["candidates"] for e in c.get("evaluations", [])])
    return rep


def render_html(rep: Report) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(rep.title)}"
             "</title><style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;}"
             "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;"
             "padding:2px 6px;text-align:right}th{background:#eee}img{max-width:100%}</style>"
             f"</head><body><h1>{html.escape(rep.title)}</h1>"]
    for kind, val in rep.blocks:
        if kind == "h":
            parts.append(f"<h2>{html.escape(val)}</h2>")
        elif kind == "p":
            parts.append(f"<p>{html.escape(val)}</p>")
        elif kind == "table":
            head, rows = val
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
                         + "</tr>")
            parts.extend("<tr>" + "".join(f"<td>{html.escape(_cell(c))}</td>" for c in row)
                         + "</tr>" for row in rows)
            parts.append("</table>")
        elif kind == "img":
            name, png = val
            data = base64.b64encode(png).decode()
            parts.append(f"<p><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def render_markdown(rep: Report, image_dir: Path, link_prefix: str) -> str:
    """Markdown; PNGs go to `image_dir` and are linked as `link_prefix/NAME.png`."""
    lines = [f"# {rep.title}", ""]
    for kind, val in rep.blocks:
        if kind == "h":
            lines += [f"## {val}", ""]
        elif kind == "p":
            lines += [val, ""]
        elif kind == "table":
            head, rows = val
            lines.append("| " + " | ".join(map(str, head)) + " |")
            lines.append("|" + "---|" * len(head))
            lines.extend("| " + " | ".join(_cell(c).replace("|", "\\|") for c in row) + " |"
                         for row in rows)
            lines.append("")
        elif kind == "img":
            name, png = val
            image_dir.mkdir(parents=True, exist_ok=True)
            (image_dir / f"{name}.png").write_bytes(png)
            lines += [f"![{name}]({link_prefix}/{name}.png)", ""]
    return "\n".join(lines)


def write_report(results: str | Path, fmt: str = "html", out: str | Path | None = None,
                 metric: str = "slo.goodput_rps") -> Path:
    """Render a sweep or capacity result as report.html / report.md; returns its path."""
    if fmt not in ("html", "md"):
        raise ValueError(f"--format must be html or md, got {fmt!r}")
    kind, folder = locate(results)
    rep = sweep_report(folder, metric) if kind == "sweep" else capacity_report(folder)
    path = Path(out) if out else folder / f"report.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "html":
        path.write_text(render_html(rep))
    else:
        image_dir = path.parent / f"{path.stem}_files"
        path.write_text(render_markdown(rep, image_dir, image_dir.name))
    return path
