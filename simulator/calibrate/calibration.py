"""A calibration's result (`Calibration`: the fitted `CostParams`, its errors per step kind,
links and hardware) and its files: the calibration YAML that `hardware: {calibration: FILE}`
loads and the predicted-vs-measured plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.calibrate.fresh_shapes import describe_fresh_shapes
from simulator.calibrate.idle_wake import format_idle_wake
from simulator.calibrate.loop import format_loop
from simulator.calibrate.profile_io import STEP_KINDS, Profile
from simulator.calibrate.serving_speed import format_serving_speed
from simulator.cost.params import CostParams


@dataclass
class Calibration:
    """A fitted `CostParams` and how well it fits (errors are (predicted - measured) /
    measured, reported as fractions)."""

    params: CostParams
    profile: Profile
    kinds: np.ndarray  # step kind of each step point
    measured_s: np.ndarray
    predicted_s: np.ndarray
    held: np.ndarray  # bool: held back from the fit
    per_kind: dict[str, dict[str, Any]]
    links: dict[str, dict[str, Any]] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    roofline_only: dict[str, Any] = field(default_factory=dict)  # errors without the terms

    @property
    def rel_err(self) -> np.ndarray:
        return (self.predicted_s - self.measured_s) / self.measured_s

    def summary(self) -> dict[str, Any]:
        e = np.abs(self.rel_err)
        return {"num_points": int(e.size), "num_held": int(self.held.sum()),
                "held_mape": float(e[self.held].mean()) if self.held.any() else None,
                "held_median_abs_err": float(np.median(e[self.held])) if self.held.any() else None,
                "train_mape": float(e[~self.held].mean()),
                "train_median_abs_err": float(np.median(e[~self.held]))}

    def format_table(self) -> str:
        lines = [f"{'kind':9s} {'train':>5s} {'held':>5s} {'MAPE train':>10s} "
                 f"{'MAPE held':>10s} {'med|err| held':>13s}"]
        rows = [*self.per_kind.items(), ("all", self._all_row())]
        for k, r in rows:
            lines.append(f"{k:9s} {r['n_train']:5d} {r['n_held']:5d} {pct(r['mape_train']):>10s} "
                         f"{pct(r['mape_held']):>10s} {pct(r['median_abs_err_held']):>13s}")
        fit = self.params.extra.get("fit") or {}
        if fit.get("wall_check"):
            w = fit["wall_check"]
            lines.append(f"(errors above on on-CPU time; x 1/{fit['cpu_available']:.2f} CPU share "
                         f"vs measured mean wall time: held-back MAPE {pct(w['mape_held'])}, "
                         f"median |err| {pct(w['median_abs_err_held'])})")
        p = self.params
        lines.append(f"executor terms: decode_padding {p.decode_padding:.2f}, overlap "
                     f"{p.overlap:.2f}, gemv_memory_efficiency {p.gemv_memory_efficiency:.2f} "
                     f"(GEMM {p.gemm_memory_efficiency:.2f}), decode_attn_overhead_s "
                     f"{p.decode_attn_overhead_s * 1e6:.0f} us, request_overhead_s "
                     f"{p.request_overhead_s * 1e6:.0f} us, gemm_row_passes_below "
                     f"{p.gemm_row_passes_below}"
                     + ("" if self.roofline_only else " (held: too few points to fit them)"))
        if self.roofline_only:
            r = self.roofline_only
            lines.append(f"(roofline only, terms at defaults: held-back MAPE {pct(r['mape_held'])}, "
                         f"median |err| {pct(r['median_abs_err_held'])})")
        sizes = (self.params.extra.get("fit") or {}).get("size_factors") or {}
        for name, label in (("linear_token_factors", "linears by tokens"),
                            ("lm_head_row_factors", "LM head by requests")):
            r = sizes.get(name)
            if r and "error" in r:
                lines.append(f"size factors, {label}: none ({r['error']})")
            elif r:
                lines.append(f"size factors, {label} {r['sizes'][0]}-{r['sizes'][1]}: "
                             f"{r['min']:.2f}-{r['max']:.2f} (relative to their median; the "
                             "step fit ran with them)")
        for name, link in self.links.items():
            lines.append(f"link {name}: {link['bandwidth_gb_s']:.3g} GB/s, "
                         f"{link['latency_us']:.0f} us latency (MAPE {link['mape']:.1%})")
        hs = self.params.extra.get("host_sharing")
        if hs and "error" in hs:
            lines.append(f"host sharing: not fitted ({hs['error']})")
        elif hs:
            lines.append(f"host sharing: memory share {hs['memory_share']:.2f}, compute share "
                         f"{hs['compute_share']:.2f} ({hs['num_points']} contended points, "
                         f"MAPE {hs['mape']:.1%})")
        ss = self.params.extra.get("serving_speed")
        if ss:
            lines.append(format_serving_speed(ss))
        loop = self.params.extra.get("serving_loop")
        if loop:
            lines.append(format_loop(loop))
        wake = self.params.extra.get("idle_wake")
        if wake:
            lines.append(format_idle_wake(wake))
        fresh = self.params.extra.get("fresh_shapes")
        if fresh:
            lines.append(describe_fresh_shapes(fresh))
        return "\n".join(lines)

    def _all_row(self) -> dict[str, Any]:  # noqa: D102
        return kind_stats(np.abs(self.rel_err), self.held)


def pct(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "-"


def kind_stats(abs_err: np.ndarray, held: np.ndarray) -> dict[str, Any]:
    tr, he = abs_err[~held], abs_err[held]
    return {"n_train": int(tr.size), "n_held": int(he.size),
            "mape_train": float(tr.mean()) if tr.size else None,
            "mape_held": float(he.mean()) if he.size else None,
            "median_abs_err_held": float(np.median(he)) if he.size else None}


def hardware_spec(params: CostParams, links: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The scenario `hardware:` mapping for this calibration (the calibration file's path is
    filled in by `write_calibration`); adds the fitted swap link as the device's `pcie`."""
    spec: dict[str, Any] = {"calibration": None}
    swap = links.get("swap")
    if swap:
        spec.update(base=params.device, name=params.device,
                    pcie={k: swap[k] for k in ("name", "bandwidth_gb_s", "latency_us")})
    return spec


def write_calibration(cal: Calibration, path: str | Path, plot: bool = True) -> list[Path]:
    """Write the calibration YAML (what `hardware: {calibration: FILE}` loads) and, beside it,
    `NAME.fit.png` (predicted vs measured step time)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cal.hardware["calibration"] = str(path.resolve())
    cal.params.extra["hardware"] = cal.hardware
    cal.params.save(str(path))
    written = [path]
    if plot:
        written.append(plot_fit(cal, path.with_suffix(".fit.png")))
    return written


def plot_fit(cal: Calibration, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for k in STEP_KINDS:
        for held, marker in ((False, "o"), (True, "x")):
            m = (cal.kinds == k) & (cal.held == held)
            if m.any():
                ax.scatter(cal.measured_s[m] * 1e3, cal.predicted_s[m] * 1e3, marker=marker,
                           label=f"{k} ({'held back' if held else 'fit'})", s=18)
    lim = [cal.measured_s.min() * 1e3 * 0.8, max(cal.measured_s.max(), cal.predicted_s.max()) * 1e3 * 1.2]
    ax.plot(lim, lim, "k--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    s = cal.summary()
    held = s["held_median_abs_err"]
    ax.set_title(f"{cal.params.model} on {cal.params.device}: held-back median |err| "
                 f"{held:.1%}" if held is not None else f"{cal.params.model} on {cal.params.device}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
