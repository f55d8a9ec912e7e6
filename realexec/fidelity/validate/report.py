"""Tables, JSON, plots and the reproduction record of a `kvpd validate` run.

Files written into the output folder:
- `validation.json`: every rate's real values per repeat, their mean and spread, the
  simulated value and the signed relative error per metric, labels, failures;
- `validation.txt`: the same as a fixed-width table (also printed);
- `TRACE-MODE-cdf.png`: CDFs of real vs simulated TTFT and TPOT, one colour per rate;
- `TRACE-MODE-scatter.png`: per-request real vs simulated TTFT and E2E;
- `repro.json`: what reproduces the run (model config, seed, traces, knobs, calibration,
  library versions, device facts, git commit).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from realexec.fidelity.validate.plan import PD_FIRST_TOKEN
from realexec.fidelity.validate.validation import METRICS, TARGETS, ValidateConfig
from simulator.calibrate.step_pricing import STEP_KINDS, priced_total

SHOWN = ("throughput_tok_s", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90",
         "tpot_p99", "e2e_p50", "e2e_p90", "e2e_p99", "preemptions")
SHORT = {"throughput_tok_s": "tput", "ttft_p50": "ttft50", "ttft_p90": "ttft90",
         "ttft_p99": "ttft99", "tpot_p50": "tpot50", "tpot_p90": "tpot90", "tpot_p99": "tpot99",
         "e2e_p50": "e2e50", "e2e_p90": "e2e90", "e2e_p99": "e2e99", "preemptions": "preempt"}


def _cell(m: dict[str, Any], name: str) -> str:
    err, spread = m.get("error"), m.get("spread")
    if err is None:
        return "-"
    if name == "preemptions":
        return f"{err:+.0f}"
    mark = "" if name not in TARGETS or abs(err) <= TARGETS[name] else "*"
    return f"{err:+.1%}{mark}" + (f"±{spread:.0%}" if spread is not None else "")


def _step(r: dict[str, Any]) -> str:
    roles = r.get("step_error_by_role")
    if roles:  # PD: prefill / decode worker, priced as the simulator does (host sharing)
        parts = [f"{role[0].upper()}{priced_total(e):+.0%}"
                 for role, e in sorted(roles.items(), key=lambda kv: kv[0] != "prefill")]
        return "/".join(parts)
    e = r.get("step_error")
    return f"{e['total']:+.0%}" if e else "-"


def _with_legend(lines: list[str], legend: str) -> str:
    """A table (header + rows) with its legend; "" when it has no rows."""
    return "" if len(lines) == 1 else "\n".join([*lines, legend])


def format_pd_steps(summary: dict[str, Any]) -> str:
    """The cost model on the PD workers' own steps: per role, predicted total / measured
    total - 1 without (plain) and with host sharing (shared), over the steps that started
    while the other worker was in a step and over those that started alone."""
    lines = [f"{'trace':6s} {'rate':>6s} {'role':8s} {'steps':>6s} {'overlap':>7s} "
             f"{'plain':>7s} {'shared':>7s}  {'overlapped pl/sh':>17s}  {'alone pl/sh':>13s}"]

    def pct(e: dict[str, Any] | None, key: str) -> str:
        return f"{e[key]['total']:+.1%}" if e and key in e else "-"

    for r in summary["results"]:
        for role, e in (r.get("step_error_by_role") or {}).items():
            ov, al = e.get("overlapped"), e.get("alone")
            lines.append(
                f"{r['trace']:6s} {r['rate']:6.3f} {role:8s} {e['plain']['num_steps']:6d} "
                f"{e['overlapped_fraction']:7.0%} {pct(e, 'plain'):>7s} {pct(e, 'shared'):>7s}  "
                f"{pct(ov, 'plain') + '/' + pct(ov, 'shared'):>17s}  "
                f"{pct(al, 'plain') + '/' + pct(al, 'shared'):>13s}")
    return _with_legend(lines, "PD workers' own steps: cost model predicted total / measured "
                        "total - 1; plain: alone on the host, shared: with the host shares as "
                        "simulated; overlap: share of steps that started while the other worker "
                        "was in a step")


def format_steps_by_kind(summary: dict[str, Any]) -> str:
    """The cost model on the real runs' own steps by kind (`simulator.calibrate.step_pricing.step_kind`):
    predicted total / measured total - 1 and the number of steps."""
    seen = {k for r in summary["results"] for k in ((r.get("step_error") or {}).get("by_kind") or {})}
    kinds = [k for k in STEP_KINDS if k in seen]
    if not kinds:
        return ""
    lines = [f"{'trace':6s} {'mode':9s} {'rate':>6s} " + " ".join(f"{k:>17s}" for k in kinds)]
    for r in summary["results"]:
        by = (r.get("step_error") or {}).get("by_kind") or {}
        cells = [f"{by[k]['total']:+.1%} ({by[k]['num_steps']})" if k in by else "-" for k in kinds]
        lines.append(f"{r['trace']:6s} {r['mode']:9s} {r['rate']:6.3f} "
                     + " ".join(f"{c:>17s}" for c in cells))
    lines.append("the cost model on the real runs' own steps by kind (decode: by batch size; PD: "
                 "both workers, without host sharing): predicted total / measured total - 1 (steps)")
    return "\n".join(lines)


def format_queueing(summary: dict[str, Any]) -> str:
    """TTFT split into queueing (arrival to the first step of the engine that ran the prompt)
    and the rest, real (mean over repeats) vs simulated, in ms: is a TTFT error a wait or
    the prompt's service? Rows for rates whose real runs recorded queueing."""
    lines = [f"{'trace':6s} {'mode':9s} {'rate':>6s}  {'queueing p50/p90/p99 real':>26s}  "
             f"{'simulated':>17s}  {'TTFT - queueing p50 real/sim':>28s}"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.0f}"

    for r in summary["results"]:
        m = r["metrics"]
        q = [m.get(f"queueing_p{p}") or {} for p in (50, 90, 99)]
        if not any(x.get("real_mean") is not None for x in q):
            continue
        real = "/".join(ms(x.get("real_mean")) for x in q)
        sim = "/".join(ms(x.get("sim")) for x in q)
        t = m["ttft_p50"]
        rest = (f"{ms(t.get('real_mean') - q[0]['real_mean'])}/{ms(t['sim'] - q[0]['sim'])}"
                if t.get("real_mean") is not None and q[0].get("real_mean") is not None
                and t.get("sim") is not None and q[0].get("sim") is not None else "-")
        lines.append(f"{r['trace']:6s} {r['mode']:9s} {r['rate']:6.3f}  {real:>26s}  {sim:>17s}  "
                     f"{rest:>28s}")
    return _with_legend(lines, "queueing (ms): arrival to the first step of the engine that ran "
                        "the prompt (real: reported by that worker); TTFT - queueing: the p50s' "
                        "difference, the prompt's service and delivery")


def _avail(r: dict[str, Any]) -> str:
    real = [a for a in r.get("cpu_available") or [] if a is not None]
    prof = r.get("cpu_available_profile")
    a = f"{np.mean(real):.2f}" if real else "-"
    return a + "/" + (f"{prof:.2f}" if prof is not None else "-")


def _diagnostic_table(summary: dict[str, Any], key: str, columns: list[tuple[str, int]],
                      cells_of, legend: str) -> str:
    """One row per rate that has the diagnostic `key`: its own `columns` (name, width;
    values from `cells_of(diagnostic)`), then its errors per metric."""
    head = (f"{'trace':6s} {'mode':9s} {'rate':>6s} "
            + " ".join(f"{name:>{w}s}" for name, w in columns) + " "
            + " ".join(f"{SHORT[m]:>12s}" for m in SHOWN))
    lines = [head]
    for r in summary["results"]:
        a = r.get(key)
        if not a:
            continue
        own = " ".join(f"{v:>{w}s}" for v, (_, w) in zip(cells_of(a), columns))
        cells = " ".join(f"{_cell(a['metrics'][m], m):>12s}" for m in SHOWN)
        lines.append(f"{r['trace']:6s} {r['mode']:9s} {r['rate']:6.3f} {own} {cells}")
    lines.append(legend)
    return "\n".join(lines)


def format_adjusted(summary: dict[str, Any]) -> str:
    """The diagnostic re-run: errors once the device speed follows the machine's speed at
    each rate (speed probe x CPU share)."""
    def cells(a: dict[str, Any]) -> list[str]:
        probe = a.get("probe_speed")
        return ["-" if probe is None else f"{probe:.2f}", f"{a['speed_factor']:.2f}"]

    return _diagnostic_table(
        summary, "adjusted", [("probe", 6), ("speed", 6)], cells,
        "probe: calibrated / measured time of a few profile steps re-timed just before the "
        "rate's runs (< 1: the machine is slower than when profiled); speed: probe x (CPU "
        "share of the real runs) / (CPU share during the profile); the simulated device is "
        "scaled by it (a diagnostic, not the validation)")


def _factor_cells(a: dict[str, Any]) -> list[str]:
    f = a["factors"]
    return [f"{f['prefill']:.2f}/{f['decode']:.2f}" if "prefill" in f else f"{f['engine']:.2f}"]


def format_refreshed(summary: dict[str, Any]) -> str:
    """The simulator re-run at the speed the serving probes measured just before each rate's
    runs (`Validation._refreshed`)."""
    return _diagnostic_table(
        summary, "refreshed", [("speed", 11)], _factor_cells,
        "speed: the cost model's total / the measured total over the steps of a short fixed "
        "load (other requests than the validated ones) replayed through the same real engine "
        "just before each run, mean over the rate's runs (PD: prefill/decode worker, with host "
        "sharing); the simulated device of each engine is scaled by it")


def format_refreshed_trace(summary: dict[str, Any]) -> str:
    """The simulator re-run at the speed the trace probes measured just before each rate's
    runs (`Validation._refreshed` of the "trace" probes)."""
    return _diagnostic_table(
        summary, "refreshed_trace", [("speed", 11)], _factor_cells,
        "speed: as above, over the steps of ~20 s of the same trace at the same rate (requests "
        "after every validated one: the runs' own mix of steps) replayed through the same real "
        "engine just before each run, mean over the rate's runs")


def format_refreshed_bracketed(summary: dict[str, Any]) -> str:
    """The simulator run once per real run at the speed of the serving probes just before
    and just after it (`Validation._bracketed`)."""
    return _diagnostic_table(
        summary, "refreshed_bracketed", [("speed", 11)], _factor_cells,
        "speed: per real run, the mean of the serving probe just before and the one just "
        "after it (the last run's: a closing probe), the simulator run once at each run's "
        "speed and their mean compared; shown: the mean speed over the rate's runs")


def format_step_adjusted(summary: dict[str, Any]) -> str:
    """The diagnostic re-run at the speed each engine's own steps ran in the real runs."""
    return _diagnostic_table(
        summary, "step_adjusted", [("speed", 11)], _factor_cells,
        "speed: the cost model's total over the real runs' own steps / their measured total "
        "(PD: prefill/decode worker, with host sharing); the simulated device of each engine "
        "is scaled by it, so what is left is the error of everything but step times (a "
        "diagnostic, not the validation)")


# The simulator re-runs reported beside the validation: result key, title, table.
RE_RUNS = (("adjusted", "speed-adjusted diagnostic", format_adjusted),
           ("refreshed", "refreshed by serving probes", format_refreshed),
           ("refreshed_trace", "refreshed by trace probes", format_refreshed_trace),
           ("refreshed_bracketed", "refreshed by serving probes around each run",
            format_refreshed_bracketed),
           ("step_adjusted", "step-speed diagnostic", format_step_adjusted))


def format_re_runs(summary: dict[str, Any], keys: tuple[str, ...] | None = None) -> str:
    """The `RE_RUNS` tables (those named in `keys`, default all), each under its title."""
    return "\n\n".join(f"{title}:\n{table(summary)}" for key, title, table in RE_RUNS
                       if keys is None or key in keys)


def format_table(summary: dict[str, Any]) -> str:
    """One row per (trace, mode, rate): signed error (sim - real) / real per metric, with the
    real runs' spread (half range / mean) after ±; * marks a missed target."""
    head = (f"{'trace':6s} {'mode':9s} {'rate':>6s} {'load':>5s} {'label':12s} {'n':>4s} "
            f"{'cpu':>9s} {'step':>11s} " + " ".join(f"{SHORT[m]:>12s}" for m in SHOWN))
    lines = [head]
    for r in summary["results"]:
        cells = " ".join(f"{_cell(r['metrics'][m], m):>12s}" for m in SHOWN)
        lines.append(f"{r['trace']:6s} {r['mode']:9s} {r['rate']:6.3f} {r['load']:5.2f} "
                     f"{r['label']:12s} {r['num_requests']:4d} {_avail(r):>9s} {_step(r):>11s} {cells}")
    for f in summary["failures"]:
        rate = "-" if f.get("rate") is None else f"{f['rate']:.3f} req/s"
        lines.append(f"FAILED {f.get('trace', '*')} {f['mode']} at {rate}: {f['error']}")
    lines.append("cells: simulator error (sim - real)/real ± real run-to-run spread (half range "
                 "/ mean); * = outside target (5% tput/p50, 10% p90/p99); preempt: sim - real")
    if any(m.get("error") is not None and m.get("spread") is None
           for r in summary["results"] for m in r["metrics"].values()):
        lines.append("no ±: one real run at that rate, so its run-to-run spread is not measured")
    lines.append("step: the cost model on the real run's own steps (shapes, measured times): "
                 "predicted total / measured total - 1 (PD: P prefill / D decode worker, with host sharing)")
    lines.append("cpu: share of its runnable time the engine thread got on a CPU in the real runs "
                 "/ during the profile (1.00 = no contention; lower = shared cores)")
    return "\n".join(lines)


def targets_summary(summary: dict[str, Any], diagnostic: str | None = None) -> dict[str, Any]:
    """Targets met over the under-loaded rates, per (trace, mode): of the validation, or of a
    re-run (`diagnostic`: a key of `RE_RUNS`)."""
    from realexec.fidelity.validate.validation import check_targets

    out: dict[str, Any] = {}
    for r in summary["results"]:
        if r["label"] != "under-loaded" or (diagnostic and not r.get(diagnostic)):
            continue
        key = f"{r['trace']}/{r['mode']}"
        d = out.setdefault(key, {"met": 0, "checked": 0, "missed": []})
        met = check_targets(r[diagnostic]["metrics"]) if diagnostic else r["targets_met"]
        for m, ok in met.items():
            d["checked"] += 1
            d["met"] += int(ok)
            if not ok:
                d["missed"].append(f"{m}@{r['rate']:.3f}")
    return out


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
        "command": "kvpd validate", "seed": cfg.seed, "model": validation.model_name,
        "model_config": validation.model_config, "dtype": validation.dtype,
        "threads_per_engine": validation.threads, "knobs": cfg.knobs.to_dict(),
        "fractions_of_capacity": list(cfg.fractions), "rates": cfg.rates,
        "duration_s": cfg.duration_s, "min_requests": cfg.min_requests,
        "max_requests": cfg.max_requests, "repeats": cfg.repeats,
        "capacity_requests": cfg.capacity_requests, "traces": validation.traces,
        "serving_probe_requests": cfg.serving_probe_requests,
        "serving_probe_trace": "seed + 7, realexec.fidelity.validate.speed_probe.serving_probe_trace",
        "trace_probe_s": cfg.trace_probe_s,
        "trace_probe": "seed + 11, realexec.fidelity.validate.plan.trace_probe (traces.*.trace_probes)",
        "trace_files": "runs/TRACE-MODE/rateI-trace.csv (exact requests of each run)",
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
    for (kind, mode, _i), rec in sorted(validation.records.items()):
        groups.setdefault((kind, mode), []).append(rec)
    for (kind, mode), recs in groups.items():
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
        written.append(_save(fig, f"{kind} / {mode}: real (solid) vs simulated (dashed)",
                             out / f"{kind}-{mode}-cdf.png"))
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
        written.append(_save(fig, f"{kind} / {mode}: per request",
                             out / f"{kind}-{mode}-scatter.png"))
    return written


def write_report(cfg: ValidateConfig, validation: Any, summary: dict[str, Any]) -> list[Path]:
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    measured = getattr(validation, "measured_serving_speed", None)  # the calibration's
    serving = measured if measured and cfg.serving_speed else None  # what the engines ran at
    summary = {**summary, "targets": targets_summary(summary),
               **{f"targets_{key}": targets_summary(summary, key) for key, _, _ in RE_RUNS},
               "metric_paths": {m: list(p) for m, p in METRICS},
               "serving_speed": serving, "serving_speed_measured": measured}
    (out / "validation.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    extra = [t for t in (format_queueing(summary), format_steps_by_kind(summary),
                         format_pd_steps(summary)) if t]
    if measured:
        from simulator.calibrate.serving_speed import format_serving_speed

        how = ("The simulated engines ran at these speeds (the calibration's, from its "
               "profile's serving probe); the speed-adjusted re-run scales them, the refreshed "
               "and step-speed re-runs replace them with their own factors." if serving else
               "Not applied: the simulated engines ran at the calibration's isolated speed "
               "(kvpd validate --serving-speed applies these).")
        extra.insert(0, format_serving_speed(measured) + "\n" + how)
    params = getattr(validation, "params", None)
    fresh = params.extra.get("fresh_shapes") if params is not None else None
    if fresh:  # the profile's steps of never-run shapes vs repeated ones
        from simulator.calibrate.fresh_shapes import describe_fresh_shapes

        extra.insert(0, describe_fresh_shapes(fresh) + " (the calibration's profile)")
    loop = params.extra.get("serving_loop") if params is not None else None
    if loop:  # host time between serving steps, which the simulated engines carry
        from simulator.calibrate.loop import format_loop

        extra.insert(0, format_loop(loop) + "; every simulated step carries the loop, every "
                     "PD prompt hand-off its cost")
    (out / "validation.txt").write_text(
        format_table(summary) + "\n\n" + format_re_runs(summary) + "\n"
        + "".join(f"\n{t}\n" for t in extra))
    return [out / "validation.json", out / "validation.txt", write_repro(cfg, validation, out),
            *plot(validation, out)]
