"""PNG plots of sweep and capacity results (matplotlib, Agg), returned as bytes so a
report can embed them (HTML) or write them next to itself (Markdown)."""

from __future__ import annotations

import io
import math
from collections import defaultdict
from typing import Any

# (column, label) of the metrics drawn against the axes.
LINE_METRICS = (
    ("slo.goodput_rps", "goodput (req/s)"),
    ("slo.attainment", "SLO attainment"),
    ("throughput.output_tokens_per_s", "output tok/s"),
    ("ttft_s.p90", "TTFT p90 (s)"),
    ("tpot_s.p90", "TPOT p90 (s)"),
    ("e2e_s.p90", "E2E p90 (s)"),
)
# Axes with more distinct values than this are drawn as scatter, not grouped lines.
MAX_GROUPS = 8
MAX_HEATMAP_CELLS = 30


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    _plt().close(fig)
    return buf.getvalue()


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def distinct(values: list[Any]) -> list[Any]:
    """Distinct values: sorted if all numeric, else in order of first appearance."""
    seen = list(dict.fromkeys(v for v in values if v is not None))
    return sorted(seen) if all(_is_num(v) for v in seen) else seen


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both lower x (cost) and higher y."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def plot_pareto(rows: list[dict], label_cols: list[str], metric: str = "slo.goodput_rps") -> bytes | None:
    """Goodput (or `metric`) against cluster cost, the Pareto front joined and labelled."""
    ok = [r for r in rows if r.get("status") == "ok" and _is_num(r.get(metric))]
    priced = [r for r in ok if _is_num(r.get("cost.usd_per_hour"))]
    xcol, xlabel = ("cost.usd_per_hour", "cluster cost (USD/hour)") if priced else \
        ("cost.gpus", "accelerators (no prices known)")
    use = priced or [r for r in ok if _is_num(r.get("cost.gpus"))]
    if not use:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    pts = [(float(r[xcol]), float(r[metric])) for r in use]
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, alpha=0.5, label="points")
    front = pareto_front(pts)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "o-", color="C3",
            label="Pareto front")
    mid = (min(p[0] for p in pts) + max(p[0] for p in pts)) / 2
    for i in front[:12]:
        text = ", ".join(f"{c.split('.')[-1]}={_short(use[i].get(c))}" for c in label_cols)
        right = pts[i][0] > mid  # labels of right-hand points go left, inside the axes
        ax.annotate(text, pts[i], fontsize=6, xytext=(-4 if right else 4, 4),
                    textcoords="offset points", ha="right" if right else "left")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{metric} vs cost")
    return _png(fig)


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def plot_metric_lines(rows: list[dict], axis: str, group: str | None) -> bytes | None:
    """Each metric against `axis`, one line per value of `group` (mean over other axes)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get(axis) is not None]
    xs = distinct([r[axis] for r in ok])
    if len(xs) < 2:
        return None
    numeric = all(_is_num(x) for x in xs)
    groups = distinct([r.get(group) for r in ok]) if group else [None]
    if len(groups) > MAX_GROUPS:
        groups = [None]
    plt = _plt()
    fig, axs = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (col, label) in zip(axs.flat, LINE_METRICS):
        for g in groups:
            sel = [r for r in ok if g is None or r.get(group) == g]
            if len(xs) > 3 * MAX_GROUPS and numeric:  # sampled axis: scatter
                ax.scatter([r[axis] for r in sel if _is_num(r.get(col))],
                           [r[col] for r in sel if _is_num(r.get(col))], s=8,
                           label=None if g is None else f"{group.split('.')[-1]}={_short(g)}")
                continue
            means = defaultdict(list)
            for r in sel:
                if _is_num(r.get(col)):
                    means[r[axis]].append(float(r[col]))
            px = [x for x in xs if x in means]
            py = [sum(means[x]) / len(means[x]) for x in px]
            pos = px if numeric else [xs.index(x) for x in px]
            ax.plot(pos, py, "o-", ms=3,
                    label=None if g is None else f"{group.split('.')[-1]}={_short(g)}")
        if not numeric:
            ax.set_xticks(range(len(xs)), [str(x) for x in xs], rotation=30, fontsize=6)
        ax.set_xlabel(axis)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if groups != [None]:
        axs.flat[0].legend(fontsize=7)
    fig.suptitle(f"metrics vs {axis}" + (f" by {group}" if groups != [None] else "")
                 + " (mean over the other axes)")
    return _png(fig)


def plot_heatmap(rows: list[dict], ax1: str, ax2: str, metric: str = "slo.goodput_rps") -> bytes | None:
    """Mean `metric` over the other axes, for each (ax1, ax2) cell."""
    ok = [r for r in rows if r.get("status") == "ok" and _is_num(r.get(metric))]
    xs, ys = distinct([r.get(ax1) for r in ok]), distinct([r.get(ax2) for r in ok])
    if not (2 <= len(xs) <= MAX_HEATMAP_CELLS and 2 <= len(ys) <= MAX_HEATMAP_CELLS):
        return None
    import numpy as np

    cells = defaultdict(list)
    for r in ok:
        cells[(r.get(ax1), r.get(ax2))].append(float(r[metric]))
    grid = np.full((len(ys), len(xs)), np.nan)
    for (x, y), vals in cells.items():
        if x in xs and y in ys:
            grid[ys.index(y), xs.index(x)] = sum(vals) / len(vals)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.5, 2.5 + 0.9 * len(xs)), max(3.5, 1.5 + 0.55 * len(ys))))
    im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(xs)), [_short(x) for x in xs], rotation=30, fontsize=7)
    ax.set_yticks(range(len(ys)), [_short(y) for y in ys], fontsize=7)
    for (j, i), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(i, j, f"{v:.3g}", ha="center", va="center", fontsize=6, color="w")
    ax.set_xlabel(ax1)
    ax.set_ylabel(ax2)
    fig.colorbar(im, ax=ax, label=metric)
    ax.set_title(f"{metric} (mean over the other axes)", fontsize=9)
    return _png(fig)


def plot_capacity_curves(result: dict) -> list[tuple[str, bytes]]:
    """Per SLO target: the metric against rate for each candidate, with the limit and answer."""
    out = []
    plt = _plt()
    for t in result["slo"]["targets"]:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for k, c in enumerate(result["candidates"]):
            evs = sorted((e for e in c.get("evaluations", []) if e["variant"] == 0),
                         key=lambda e: e["rate"])
            pts = [(e["rate"], e["metrics"].get(t["column"]), e["ok"]) for e in evs
                   if _is_num(e["metrics"].get(t["column"]))]
            if not pts:
                continue
            color = f"C{k % 10}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=color, label=c["name"])
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=14, color=color,
                       marker="o", edgecolors=["k" if p[2] else "none" for p in pts])
            if c.get("max_rate_rps"):
                ax.axvline(c["max_rate_rps"], color=color, ls=":", lw=1)
        ax.axhline(t["limit_s"], color="k", ls="--", lw=1, label=f"limit {t['limit_s']:g} s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{t['name']} (s)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        ax.set_title(f"{t['name']} vs rate (dotted: the answer; ringed: SLOs met)", fontsize=9)
        out.append((f"capacity_{t['name']}", _png(fig)))
    return out


def plot_capacity_bars(result: dict) -> bytes | None:
    """Max rate per GPU and USD per million output tokens, per candidate."""
    cands = [c for c in result["candidates"] if c.get("max_rate_rps")]
    if not cands:
        return None
    plt = _plt()
    fig, axs = plt.subplots(1, 2, figsize=(11, 3.8))
    names = [c["name"] for c in cands]
    axs[0].bar(names, [c.get("max_rate_per_gpu") or 0 for c in cands], color="C0")
    axs[0].set_ylabel("max req/s per GPU")
    cost = [c.get("usd_per_m_output_tokens") for c in cands]
    axs[1].bar(names, [v if v is not None else 0 for v in cost], color="C2")
    for i, v in enumerate(cost):
        if v is None:
            axs[1].text(i, 0, "no price", ha="center", va="bottom", fontsize=7)
    axs[1].set_ylabel("USD per million output tokens")
    for ax in axs:
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    return _png(fig)
