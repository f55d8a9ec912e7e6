"""PNG plots of a simulation run: latency CDFs, TTFT/TPOT against arrival time, and
per-replica batch size and KV usage over time (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, values: np.ndarray, label: str) -> None:
    v = np.sort(values[~np.isnan(values)])
    if v.size:
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)


def plot_latency_cdfs(records: dict, path: Path, title: str = "") -> Path:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, name in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "E2E")):
        _cdf(ax, records[key], name)
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    fig.suptitle(title or "latency CDFs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_latency_over_time(records: dict, path: Path, title: str = "") -> Path:
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    for ax, key, name in zip(axes, ("ttft_s", "tpot_s"), ("TTFT (s)", "TPOT (s)")):
        ax.scatter(records["arrival_s"], records[key], s=3, alpha=0.5)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("arrival time (s)")
    fig.suptitle(title or "latency against arrival time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_replicas(timeline_cols: dict, path: Path, title: str = "") -> Path:
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    reps = timeline_cols["replica"]
    for name in sorted(set(reps.tolist())):
        m = reps == name
        t = timeline_cols["start_s"][m].astype(float)
        axes[0].step(t, timeline_cols["batch_size"][m].astype(float), where="post", label=name, lw=0.7)
        axes[1].step(t, timeline_cols["kv_usage"][m].astype(float), where="post", label=name, lw=0.7)
    axes[0].set_ylabel("batch size (requests)")
    axes[1].set_ylabel("KV blocks in use (fraction)")
    axes[1].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if len(set(reps.tolist())) <= 16:
        axes[0].legend(fontsize=7, ncol=4)
    fig.suptitle(title or "per-replica batch size and KV usage")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_run(result, out_dir: Path) -> list[Path]:
    """All plots of a `SimResult` into `out_dir`."""
    name = result.scenario.name
    paths = [
        plot_latency_cdfs(result.records, out_dir / "latency_cdf.png", f"{name}: latency CDFs"),
        plot_latency_over_time(result.records, out_dir / "latency_vs_arrival.png", name),
    ]
    cols = result.timeline.columns()
    if len(cols["start_s"]):
        paths.append(plot_replicas(cols, out_dir / "replicas.png", name))
    return paths
