"""Profile -> calibrate -> validate on this CPU with the ladder's default model (llama-50m,
fp32, one torch thread per engine), colocated and 1P1D PD, on the two shipped scenarios
(scenarios/validate/azure.yaml: the Azure conversation slice; gamma.yaml: bursty Gamma
arrivals, CV 4) with the same calibration.

Prints the calibration's held-back error per step kind (and refuses a fit over 10% unless
--accept-noisy, as `kvpd calibrate` does), then `kvpd validate`'s report: the verdict counts
(met / within noise / missed) and the run-to-run spread first, then the table.
Run: `python bench/validate_cpu.py [--out DIR]`.

Shortened to fit ~15 minutes on 2 shared cores (the flags below): each run replays the first
rate x --duration-s requests (at least --min-requests) of a scenario rather than all of it;
2 real repeats per rate. The full run of issue 31's targets (about 100 minutes on a quiet
2-core machine): `python bench/validate_cpu.py --real-repeats 3 --duration-s 60`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("out/bench-validate-cpu"))
    p.add_argument("--threads", type=int, default=1, help="torch threads per engine")
    p.add_argument("--repeats", type=int, default=5, help="profile rounds")
    p.add_argument("--statistic", default="cpu", choices=["cpu", "mean", "median"],
                   help="what the fit matches per profile point (cpu: on-CPU time, then scaled "
                   "by the profile's CPU share; see simulator/calibrate/fit.py)")
    p.add_argument("--duration-s", type=float, default=10.0)
    p.add_argument("--min-requests", type=int, default=10)
    p.add_argument("--max-requests", type=int, default=400)
    p.add_argument("--real-repeats", type=int, default=2)
    p.add_argument("--traces", default="azure,gamma")
    p.add_argument("--modes", default="colocated,pd")
    p.add_argument("--serving-requests", type=int, default=48,
                   help="the profile's serving probe, as `kvpd profile` runs it (the serving "
                   "loop's host time, KV hand-off and landing costs; 0: none)")
    p.add_argument("--profile", type=Path, help="reuse this profile instead of profiling")
    p.add_argument("--accept-noisy", action="store_true", help="validate a fit over 10%% anyway")
    args = p.parse_args()

    import torch

    from realexec.fidelity.profile.device_profile import profile_device
    from realexec.fidelity.profile.profiler import grid_preset
    from realexec.fidelity.validate.report import format_report, write_report
    from realexec.fidelity.validate.source import shipped
    from realexec.fidelity.validate.validation import ValidateConfig, Validation
    from simulator.calibrate.calibration import write_calibration
    from simulator.calibrate.fit import calibrate
    from simulator.calibrate.gate import format_spread, profile_spread, refusal

    t_all = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    if args.profile is None:
        t0 = time.perf_counter()
        prof_path = profile_device(args.out / "profile.csv", "llama-50m", "fp32", "cpu",
                                   args.threads, grid_preset("default", repeats=args.repeats),
                                   seed=0, serving_requests=args.serving_requests,
                                   progress=lambda m: print("  " + m, flush=True))
        print(f"profile: {time.perf_counter() - t0:.0f} s -> {prof_path}")
    else:
        prof_path = args.profile
    cal = calibrate(prof_path, statistic=args.statistic)
    facts = cal.params.extra["device_facts"]
    print(f"\n== calibration ({args.statistic} step times; held-back points) on {facts['name']}, "
          f"{facts['torch_threads']} thread(s), CPU share during profile "
          f"{facts.get('cpu_available') or float('nan'):.2f}")
    print(cal.format_table())
    print(format_spread(profile_spread(cal)))
    why = refusal(cal, args.accept_noisy)
    if why:
        print(f"refused: {why}")
        return 2
    cal_path = args.out / "cpu-llama-50m.yaml"
    write_calibration(cal, cal_path)

    cfg = ValidateConfig(
        calibration=cal_path, out=args.out / "validate",
        scenarios=tuple(shipped(k) for k in args.traces.split(",")),
        modes=tuple(args.modes.split(",")), duration_s=args.duration_s,
        min_requests=args.min_requests, max_requests=args.max_requests,
        repeats=args.real_repeats, threads=args.threads, device="cpu")
    v = Validation(cfg, progress=lambda m: print("  " + m, flush=True))
    summary = v.run()
    write_report(cfg, v, summary)
    print("\n== validation (sim vs real)")
    print(format_report(summary))
    held = cal.summary()["held_median_abs_err"]
    print(f"\nstep-time fit: held-back median |error| {held:.1%} (target <= 5%): "
          f"{'met' if held <= 0.05 else 'NOT met'}")
    print(f"total {time.perf_counter() - t_all:.0f} s; files in {args.out}")
    saved = json.loads((cfg.out / "validation.json").read_text())
    (args.out / "bench.json").write_text(json.dumps(
        {"calibration": cal.summary(), "per_kind": cal.per_kind,
         "verdicts": saved["verdicts"], "spread": saved["spread"]}, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
