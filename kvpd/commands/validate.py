"""`kvpd validate SCENARIO.yaml --calibration FILE`: the calibrated simulator judged against real
runs of the same scenarios (verdicts per metric; `--check` exits 1 on a missed one)."""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
from collections.abc import Iterator


def _floats(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals or not all(0 < v < math.inf for v in vals):
        raise argparse.ArgumentTypeError(f"expected finite positive numbers, got {text!r}")
    return vals


def _names(allowed: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        vals = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [v for v in vals if v not in allowed]
        if not vals or bad:
            raise argparse.ArgumentTypeError(f"expected some of {','.join(allowed)}, got {text!r}")
        return vals
    return parse


TRACE_KINDS = ("azure", "gamma")  # = realexec.fidelity.validate.source.TRACE_KINDS (kept light here)
MODES = ("colocated", "pd")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate", help="judge the calibrated simulator against real runs of scenarios",
        description="Replay each SCENARIO (any that kvpd simulate runs: any trace format, "
        "synthetic load, prefix caching, colocated or 1P1D PD) on the real engine through the "
        "replay client and in the simulator with the calibrated device, the same knobs and KV "
        "blocks, at rates set from the simulated capacity; each real run is bracketed by "
        "serving probes that set the simulated speed. Prints per metric the signed error and "
        "a verdict: met (|error| <= 5% tput/p50, 10% p90/p99), within noise (<= tolerance + "
        "the real repeats' spread) or missed; writes validation.json/txt, plots, repro.json.")
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                   help="scenario YAML file(s); its hardware is the calibrated device (leave "
                   "the key out), its model and dtype default to the calibration's")
    p.add_argument("--calibration", required=True, help="calibration YAML from kvpd calibrate")
    p.add_argument("--traces", type=_names(TRACE_KINDS),
                   help="shorthand for the shipped scenarios scenarios/validate/{azure,gamma}.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of every scenario, e.g. --set workload.limit=200 (repeatable)")
    p.add_argument("--model", help="shorthand for --set model=MODEL")
    p.add_argument("--modes", type=_names(MODES),
                   help="validate each scenario colocated and/or as 1P1D PD (default: as written)")
    p.add_argument("--fractions", type=_floats, default=(0.3, 0.6, 0.9),
                   help="rates as fractions of the simulated capacity")
    p.add_argument("--rates", type=_floats, help="explicit rates, requests/s (override --fractions)")
    p.add_argument("--repeats", type=int, default=2, help="real runs per rate (>= 2 measures "
                   "the run-to-run spread that 'within noise' needs)")
    p.add_argument("--duration-s", type=float, default=20.0, help="each run: rate x this requests")
    p.add_argument("--min-requests", type=int, default=12)
    p.add_argument("--max-requests", type=int, default=400)
    p.add_argument("--num-gpu-blocks", type=int, default=512,
                   help="KV blocks of both backends for scenarios without cache.num_gpu_blocks")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, help="torch threads per engine (default: the calibration's)")
    p.add_argument("--serving-probe-requests", type=int, default=16,
                   help="requests of the serving probe replayed before and after each real run "
                   "to measure the engine's speed (0: none; the calibrated speed then)")
    p.add_argument("--colocated-engine", choices=("process", "inproc"), default="process",
                   help="where the real colocated engine runs: a worker process behind ZMQ, as "
                   "kvpd serve runs it (default), or inside the validating process")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when any verdict is 'missed' (or a rate failed)")
    p.add_argument("--out", default="out/validate", help="output folder")
    p.set_defaults(func=run)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """While inside, SIGTERM, SIGINT and SIGHUP stop the validation with `ValidationInterrupted`
    (the completed rates are still reported); a second signal acts as it normally would."""
    from realexec.fidelity.validate.validation import ValidationInterrupted

    signals = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])

    def stop(signum: int, _frame: object) -> None:
        for s in signals:
            signal.signal(s, before[s])
        raise ValidationInterrupted(signal.Signals(signum).name)

    before = {s: signal.getsignal(s) or signal.SIG_DFL for s in signals}
    for s in signals:
        signal.signal(s, stop)
    try:
        yield
    finally:
        for s in signals:
            signal.signal(s, before[s])


def config(args: argparse.Namespace):
    """The `ValidateConfig` of the arguments; ValueError naming the first bad one (nothing is
    measured yet)."""
    from pathlib import Path

    from kvpd.commands.out_paths import check_out_dir
    from realexec.fidelity.validate.source import shipped
    from realexec.fidelity.validate.validation import ValidateConfig

    for name in ("repeats", "min_requests", "max_requests", "num_gpu_blocks"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.min_requests > args.max_requests:
        raise ValueError("--min-requests must not exceed --max-requests")
    if not args.duration_s > 0:
        raise ValueError(f"--duration-s must be > 0, got {args.duration_s}")
    if args.serving_probe_requests < 0:
        raise ValueError(f"--serving-probe-requests must be >= 0, got {args.serving_probe_requests}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    scenarios = [Path(p) for p in args.scenarios] + [shipped(k) for k in args.traces or ()]
    if not scenarios:
        raise ValueError("name at least one SCENARIO file (or --traces azure,gamma for the "
                         "shipped ones)")
    for p in scenarios:
        if not p.is_file():
            raise FileNotFoundError(f"scenario file not found: {p}")
    calibration = Path(args.calibration)
    if not calibration.is_file():
        raise FileNotFoundError(f"--calibration {calibration}: no such file (kvpd calibrate writes it)")
    overrides = tuple(args.overrides) + ((f"model={args.model}",) if args.model else ())
    return ValidateConfig(
        calibration=calibration, out=check_out_dir(args.out, "--out"), scenarios=tuple(scenarios),
        overrides=overrides, modes=args.modes, fractions=args.fractions, rates=args.rates,
        duration_s=args.duration_s, min_requests=args.min_requests, max_requests=args.max_requests,
        repeats=args.repeats, num_gpu_blocks=args.num_gpu_blocks,
        device=None if args.device == "auto" else args.device, threads=args.threads,
        serving_probe_requests=args.serving_probe_requests, colocated_engine=args.colocated_engine)


def run(args: argparse.Namespace) -> int:
    from realexec.fidelity.validate.report import format_report, write_report
    from realexec.fidelity.validate.validation import Validation
    from realexec.fidelity.validate.verdict import any_missed

    cfg = config(args)
    v = Validation(cfg, progress=lambda m: print(m, flush=True))  # every scenario checked here
    with _interruptible():
        summary = v.run()
    paths = write_report(cfg, v, summary)
    print("\n" + format_report(summary))
    print("wrote " + ", ".join(str(p) for p in paths))
    if summary["failures"]:
        return 1
    return 1 if args.check and any_missed(summary["results"]) else 0
