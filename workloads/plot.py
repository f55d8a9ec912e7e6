"""`plot_trace`: arrival rate over time and length histograms of a trace, as a PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workloads.trace import Trace

# Aim for about this many rate buckets across the trace (readable at 12-inch width).
TARGET_BUCKETS = 120


def default_bucket_s(trace: Trace) -> float:
    """Rate bucket width (s): duration / TARGET_BUCKETS rounded up to a 1-2-5 step, >= 1 s."""
    raw = max(trace.duration_s / TARGET_BUCKETS, 1.0)
    exp = 10 ** np.floor(np.log10(raw))
    return float(next(m * exp for m in (1, 2, 5, 10) if m * exp >= raw))


def rate_series(trace: Trace, bucket_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(bucket start times in s, requests/s in each bucket) from the first arrival."""
    if not len(trace):
        return np.zeros(0), np.zeros(0)
    idx = ((trace.arrival_s - trace.arrival_s[0]) // bucket_s).astype(np.int64)
    counts = np.bincount(idx)
    return trace.arrival_s[0] + bucket_s * np.arange(len(counts)), counts / bucket_s


def plot_trace(trace: Trace, path: str | Path, *, bucket_s: float | None = None) -> Path:
    """Write a 3-panel PNG (rate over time, prompt and output length histograms) to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not len(trace):
        raise ValueError(f"trace {trace.name!r} has no requests to plot")
    bucket = bucket_s or default_bucket_s(trace)
    if not bucket > 0:
        raise ValueError(f"bucket_s must be > 0 seconds, got {bucket_s!r}")
    t, rate = rate_series(trace, bucket)
    fig, axes = plt.subplots(3, 1, figsize=(12, 10))
    axes[0].step(t, rate, where="post")
    axes[0].set(
        xlabel="time (s)",
        ylabel=f"requests/s ({bucket:g}-s buckets)",
        title=f"{trace.name}: {len(trace)} requests over {trace.duration_s:.1f} s",
    )
    for ax, col, label in (
        (axes[1], trace.prompt_len, "prompt"),
        (axes[2], trace.output_len, "output"),
    ):
        ax.hist(col, bins=min(100, max(10, len(np.unique(col)))))
        ax.set(
            xlabel=f"{label} length (tokens)",
            ylabel="requests",
            title=f"{label}: mean {col.mean():.0f}, p50 {np.median(col):.0f}, max {col.max()}",
        )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
