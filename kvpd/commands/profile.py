"""`kvpd profile`: time real engine steps of a model on the local device over a designed grid."""

from __future__ import annotations

import argparse

from kvpd.commands.arg_types import non_negative_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="time real engine steps on this device (input of kvpd calibrate)",
        description="Time real engine steps of a model on the local device (cpu, cuda or mps): "
        "prompt steps of many lengths, prompt chunks after a context, decode steps over batch "
        "sizes x context lengths, mixed steps, the linears alone at every small size, KV swap "
        "copies and PD KV transfers, with warm-up "
        "and interleaved repeats. Writes OUT (CSV: median, mean and spread per point) and "
        "OUT with .json (device facts, model config, grid).")
    p.add_argument("--model", default="llama-50m", help="built-in name, model folder or config.json")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--hardware", help="hardware catalog entry of this device (default: guessed)")
    p.add_argument("--grid", default="default", help="grid preset: default, quick or gpu")
    p.add_argument("--repeats", type=int, help="timed rounds (samples per point)")
    p.add_argument("--warmup", type=int, help="untimed rounds before them")
    p.add_argument("--no-linears", action="store_true",
                   help="skip timing the linears alone at every small size")
    p.add_argument("--no-swap", action="store_true", help="skip KV swap copies")
    p.add_argument("--no-transfer", action="store_true", help="skip PD KV transfers")
    p.add_argument("--serving-requests", type=int, default=48,
                   help="requests of the serving probe after the grid: a short synthetic load "
                   "replayed through a real engine (and a real 1P1D pair unless "
                   "--no-transfer), whose steps give the calibration's serving_speed (0: skip)")
    p.add_argument("--blocks-in-id-order", action="store_true",
                   help="hand KV blocks out in id order, as a fresh pool does (default: in a "
                   "seeded random order, as a pool has them after traffic)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of prompts, weights and point order")
    p.add_argument("--out", default="out/profile/profile.csv", help="profile CSV path (or folder)")
    p.set_defaults(func=run)


def check_args(args: argparse.Namespace) -> None:
    """Every argument and the output paths, before the profile (minutes) runs; ValueError
    naming the first bad one."""
    from pathlib import Path

    from kvpd.commands.out_paths import check_out_file
    from realexec.fidelity.profile.facts import model_identity
    from simulator.calibrate.profile_io import profile_paths

    for name in ("threads", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.serving_requests < 0:
        raise ValueError(f"--serving-requests must be >= 0 (0: skip), got {args.serving_requests}")
    model_identity(args.model)  # a built-in name, config.json or model folder
    if args.hardware:
        from simulator.cost.hardware import get_accelerator

        get_accelerator(args.hardware)
    out = Path(args.out)
    if not out.is_dir() and out.suffix not in (".csv", ".json"):
        raise ValueError(f"--out {out}: a profile is NAME.csv (+ NAME.json) or an existing "
                         "folder (profile.csv is written in it)")
    for path in profile_paths(out):
        check_out_file(path, "--out")


def run(args: argparse.Namespace) -> int:
    from realexec.fidelity.profile.device_profile import profile_device
    from realexec.fidelity.profile.profiler import PROFILE_KINDS, grid_preset

    grid = grid_preset(args.grid, repeats=args.repeats, warmup=args.warmup,
                       scatter_blocks=False if args.blocks_in_id_order else None)
    check_args(args)
    skip = {"linears": args.no_linears, "swap": args.no_swap, "transfer": args.no_transfer}
    kinds = tuple(k for k in PROFILE_KINDS if not skip.get(k))
    path = profile_device(args.out, args.model, args.dtype,
                          None if args.device == "auto" else args.device, args.threads, grid,
                          args.seed, args.hardware, kinds, args.serving_requests,
                          progress=lambda m: print(m, flush=True))
    print(f"wrote {path} and {path.with_suffix('.json')}")
    return 0
