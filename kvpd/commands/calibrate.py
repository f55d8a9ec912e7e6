"""`kvpd calibrate PROFILE`: fit the cost model's parameters to a profile from `kvpd profile`."""

from __future__ import annotations

import argparse

from kvpd.commands.arg_types import non_negative_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate", help="fit the cost model to a step-time profile (writes a calibration)",
        description="Fit the cost model's efficiencies and overheads for the profile's device and "
        "model (scipy least squares, bounded), report the error on held-back points per step "
        "kind, fit swap and KV-transfer links, and write a calibration YAML that scenarios "
        "load with `hardware: {calibration: FILE}`, plus FILE.fit.png (predicted vs measured).")
    p.add_argument("profile", help="profile CSV (or its folder) written by kvpd profile")
    p.add_argument("--out", help="calibration YAML (default: beside the profile, DEVICE-MODEL.yaml)")
    p.add_argument("--model", help="refuse a profile of another model")
    p.add_argument("--device", help="refuse a profile of another device (catalog name)")
    p.add_argument("--hardware", help="catalog accelerator the efficiencies refer to "
                   "(default: the profile's device)")
    p.add_argument("--held-out", type=float, default=0.25,
                   help="fraction of each step kind held back to measure the error")
    p.add_argument("--statistic", choices=["median", "mean", "cpu"], default="median",
                   help="fit the points' median or mean wall time, or (one-thread CPU "
                   "profiles) their on-CPU time scaled by the profile's CPU share")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the held-back choice and starts")
    p.add_argument("--no-plot", action="store_true", help="skip FILE.fit.png")
    p.add_argument("--accept-noisy", action="store_true",
                   help="write the calibration even when its held-back median error is over "
                   "10%% (refused by default: the profile was too noisy or the model does not fit)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kvpd.commands.out_paths import check_out_file
    from simulator.calibrate.calibration import write_calibration
    from simulator.calibrate.fit import calibrate
    from simulator.calibrate.gate import format_spread, profile_spread, refusal
    from simulator.calibrate.profile_io import profile_paths

    if not 0 <= args.held_out < 1:
        raise ValueError(f"--held-out must be a fraction in [0, 1), got {args.held_out}")
    if args.out:  # before the fit: a path that cannot be written is refused at once
        if Path(args.out).suffix not in (".yaml", ".yml"):
            raise ValueError(f"--out {args.out}: a calibration is a .yaml file")
        check_out_file(args.out, "--out")
    cal = calibrate(args.profile, hardware=args.hardware, held_out=args.held_out,
                    seed=args.seed, model=args.model, device=args.device,
                    statistic=args.statistic)
    out = Path(args.out) if args.out else (
        profile_paths(args.profile)[0].parent / f"{cal.params.device}-{cal.params.model}.yaml")
    print(cal.format_table())
    print(format_spread(profile_spread(cal)))
    why = refusal(cal, args.accept_noisy)
    if why:
        raise ValueError(why + " (nothing written)")
    if not args.out:  # the default path is known only now; --out was checked before the fit
        check_out_file(out, "--out")
    paths = write_calibration(cal, out, plot=not args.no_plot)
    print(f"wrote {', '.join(map(str, paths))}")
    print(f"use it in a scenario as: hardware: {{calibration: {out}}}")
    if len(cal.hardware) > 1:
        print(f"(with the fitted swap link as the device's pcie: hardware: {cal.hardware})")
    return 0
