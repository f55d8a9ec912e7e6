"""The printout, JSON, plots and reproduction record of a `kvpd validate` run.

Files written into the output folder:
- `validation.json`: per rate, every metric's real values per repeat, their mean and spread,
  the simulated value, the signed error, the tolerance and the verdict; the verdict counts,
  the run-to-run spread, failures and warnings;
- `validation.txt`: what `kvpd validate` prints (counts and spread first, then the table);
- `CASE-cdf.png`: CDFs of real vs simulated TTFT and TPOT, one colour per rate;
- `CASE-scatter.png`: per-request real vs simulated TTFT and E2E;
- `repro.json`: what reproduces the run (scenarios, overrides, model config, knobs,
  calibration, library versions, device facts, git commit).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from realexec.fidelity.validate.plan import PD_FIRST_TOKEN
from realexec.fidelity.validate.validation import ValidateConfig
from realexec.fidelity.validate.verdict import (
    MET,
    METRICS,
    MISSED,
    NOISE,
    TARGETS,
    count_verdicts,
    judged,
    spread_summary,
)

SHOWN = ("throughput_tok_s", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90",
         "tpot_p99", "e2e_p50", "e2e_p90", "e2e_p99")
SHORT = {"throughput_tok_s": "tput", "ttft_p50": "ttft50", "ttft_p90": "ttft90",
         "ttft_p99": "ttft99", "tpot_p50": "tpot50", "tpot_p90": "tpot90", "tpot_p99": "tpot99",
         "e2e_p50": "e2e50", "e2e_p90": "e2e90", "e2e_p99": "e2e99"}
MARK = {MET: "", NOISE: "~", MISSED: "!"}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _cell(m: dict[str, Any]) -> str:
    err = m.get("error")
    if err is None:
        return "-"
    s = m.get("spread")
    return f"{err:+.1%}{MARK.get(m.get('verdict'), '')}" + (f"±{s:.0%}" if s is not None else "")


def format_headline(summary: dict[str, Any]) -> str:
    """The verdict counts (judged rates) and the real repeats' run-to-run spread."""
    res = summary["results"]
    c = count_verdicts(res)
    sp = spread_summary(res)
    n_judged = sum(1 for r in res if judged(r))
    over = len(res) - n_judged
    lines = [f"verdicts over {n_judged} under-loaded rate(s) x {len(TARGETS)} metrics: "
             f"{c[MET]} met, {c[NOISE]} within noise, {c[MISSED]} missed"
             + (f" ({over} over-loaded rate(s) not judged)" if over else ""),
             "run-to-run spread of the real repeats (max |repeat - mean| / mean): "
             + (f"median {_pct(sp['median'])}, max {_pct(sp['max'])} over {sp['count']} "
                "rate x metric pairs" if sp["count"] else "not measured (one repeat per rate)")]
    for w in summary.get("warnings") or ():
        lines.append(w)
    return "\n".join(lines)


def format_table(summary: dict[str, Any]) -> str:
    """One row per (case, rate): signed error (sim - real) / real per metric with its verdict
    mark and the real repeats' spread after ±."""
    width = max([len(r["case"]) for r in summary["results"]] + [4])
    head = (f"{'case':{width}s} {'rate':>7s} {'load':>5s} {'label':12s} {'n':>4s} {'speed':>11s} "
            + " ".join(f"{SHORT[m]:>12s}" for m in SHOWN))
    lines = [head]
    for r in summary["results"]:
        runs = [f for f in r["speed"]["runs"] if f]
        speed = "/".join(f"{np.mean([f[k] for f in runs]):.2f}" for k in runs[0]) if runs else "calib"
        cells = " ".join(f"{_cell(r['metrics'][m]):>12s}" for m in SHOWN)
        lines.append(f"{r['case']:{width}s} {r['rate']:7.3f} {r['load']:5.2f} {r['label']:12s} "
                     f"{r['num_requests']:4d} {speed:>11s} {cells}")
    for f in summary["failures"]:
        rate = "-" if f.get("rate") is None else f"{f['rate']:.3f} req/s"
        lines.append(f"FAILED {f.get('case', '*')} at {rate}: {f['error']}")
    lines.append("cells: simulator error (sim - real) / real mean, then the verdict: (none) met "
                 "(|error| <= 5% tput/p50, 10% p90/p99), ~ within noise (|error| <= tolerance + "
                 "spread), ! missed; ± the real repeats' spread")
    lines.append("speed: the simulated device's speed (x calibrated) from the serving probes "
                 "around each real run, mean over the rate's runs (PD: prefill/decode)")
    if any(m.get("error") is not None and m.get("spread") is None
           for r in summary["results"] for m in r["metrics"].values()):
        lines.append("no ±: one real run at that rate: no spread measured, so no 'within noise'")
    return "\n".join(lines)


def format_report(summary: dict[str, Any]) -> str:
    return format_headline(summary) + "\n\n" + format_table(summary)


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None



def write_repro(cfg: ValidateConfig, validation: Any, out: Path) -> Path:
    from realexec.engine.device import resolve_device
    from realexec.fidelity.profile.facts import device_facts

    cal_copy = out / Path(cfg.calibration).name
    if Path(cfg.calibration).resolve() != cal_copy.resolve():
        shutil.copy(cfg.calibration, cal_copy)
    repro = {
        "command": "kvpd validate", "scenarios": [str(p) for p in cfg.scenarios],
        "overrides": list(cfg.overrides), "modes": cfg.modes, "model": validation.model_name,
        "model_config": validation.model_config, "dtype": validation.dtype,
        "threads_per_engine": validation.threads, "cases": validation.cases_info,
        "fractions_of_capacity": list(cfg.fractions), "rates": cfg.rates,
        "duration_s": cfg.duration_s, "min_requests": cfg.min_requests,
        "max_requests": cfg.max_requests, "repeats": cfg.repeats,
        "capacity_requests": cfg.capacity_requests,
        "serving_probe_requests": cfg.serving_probe_requests,
        "serving_probe_trace": "seed + 7, realexec.fidelity.validate.speed_probe.serving_probe_trace",
        "trace_files": "runs/CASE/rateI-trace.csv (exact requests of each run)",
        "calibration": str(cal_copy), "calibration_source": str(cfg.calibration),
        "calibration_device": validation.params.device,
        "calibration_device_facts": validation.params.extra.get("device_facts"),
        "device_facts": device_facts(resolve_device(cfg.device)),
        "git_commit": _git_commit(),
        "pd_first_token": {"real": "at hand-off by the prefill worker (realexec/serving/client.py "
                                   "streams it)",
                           "simulator": f"cluster.pd.first_token: {PD_FIRST_TOKEN}"},
    }
    path = out / "repro.json"
    path.write_text(json.dumps(repro, indent=2, default=str) + "\n")
    return path


def _save(fig: Any, title: str, path: Path) -> Path:
    """Title, lay out, write and close a figure; returns its path."""
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(validation: Any, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    groups: dict[tuple[str, str], list] = {}
    for (tag, _i), rec in sorted(validation.records.items()):
        groups.setdefault(tag, []).append(rec)
    for tag, recs in groups.items():
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for j, rec in enumerate(recs):
            color = f"C{j}"
            for ax, col in zip(axes, ("ttft_s", "tpot_s")):
                for src, ls in (("real", "-"), ("sim", "--")):
                    v = np.sort(rec[src][col][~np.isnan(rec[src][col])])
                    if v.size:
                        ax.step(v, np.arange(1, v.size + 1) / v.size, ls, color=color,
                                where="post", label=f"{src} {rec['rate']:.2f} req/s")
        for ax, col in zip(axes, ("TTFT (s)", "TPOT (s)")):
            ax.set_xlabel(col)
            ax.set_ylabel("fraction of requests")
            ax.set_xscale("log")
            ax.legend(fontsize=7)
        written.append(_save(fig, f"{tag}: real (solid) vs simulated (dashed)",
                             out / f"{tag}-cdf.png"))
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for j, rec in enumerate(recs):
            for ax, col in zip(axes, ("ttft_s", "e2e_s")):
                real = dict(zip(rec["real"]["request_id"], rec["real"][col]))
                pairs = [(real[k], v) for k, v in zip(rec["sim"]["request_id"], rec["sim"][col])
                         if k in real]
                if pairs:
                    x, y = np.array(pairs).T
                    ax.scatter(x, y, s=8, color=f"C{j}", label=f"{rec['rate']:.2f} req/s")
        for ax, col in zip(axes, ("TTFT (s)", "E2E (s)")):
            lim = [max(ax.get_xlim()[0], 1e-3), max(ax.get_xlim()[1], ax.get_ylim()[1])]
            ax.plot(lim, lim, "k--", lw=0.8)
            ax.set_xlabel(f"real {col}")
            ax.set_ylabel(f"simulated {col}")
            ax.legend(fontsize=7)
        written.append(_save(fig, f"{tag}: per request",
                             out / f"{tag}-scatter.png"))
    return written


def write_report(cfg: ValidateConfig, validation: Any, summary: dict[str, Any]) -> list[Path]:
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    summary = {**summary, "verdicts": count_verdicts(summary["results"]),
               "spread": spread_summary(summary["results"]), "tolerances": TARGETS,
               "metric_paths": {m: list(p) for m, p in METRICS}}
    (out / "validation.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    (out / "validation.txt").write_text(format_report(summary) + "\n")
    return [out / "validation.json", out / "validation.txt", write_repro(cfg, validation, out),
            *plot(validation, out)]
