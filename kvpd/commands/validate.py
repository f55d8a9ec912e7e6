"""`kvpd validate`: the simulator with a calibrated device against real runs of the same traces."""

from __future__ import annotations

import argparse
import contextlib
import signal
from collections.abc import Iterator


def _floats(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return vals


def _names(allowed: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        vals = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [v for v in vals if v not in allowed]
        if not vals or bad:
            raise argparse.ArgumentTypeError(f"expected some of {','.join(allowed)}, got {text!r}")
        return vals
    return parse


TRACE_KINDS = ("azure", "gamma")  # = realexec.fidelity.validate.plan.TRACE_KINDS (kept light here)
MODES = ("colocated", "pd")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate", help="compare the calibrated simulator with real runs (errors per metric)",
        description="Run traces on the real engine (replay client) and in the simulator with a "
        "calibrated device, under the same scheduler knobs and KV blocks, at rates set from the "
        "simulated capacity (low, medium, near saturation), colocated and 1P1D PD; report the "
        "signed relative error per metric beside the real runs' spread (table, JSON, plots).")
    p.add_argument("--calibration", required=True, help="calibration YAML from kvpd calibrate")
    p.add_argument("--model", default="llama-50m", help="built-in name, model folder or config.json")
    p.add_argument("--traces", type=_names(TRACE_KINDS), default=TRACE_KINDS,
                   help="azure (Azure conversation slice) and/or gamma (bursty, CV 4)")
    p.add_argument("--modes", type=_names(MODES), default=MODES, help="colocated and/or pd")
    p.add_argument("--fractions", type=_floats, default=(0.3, 0.6, 0.9),
                   help="rates as fractions of the simulated capacity")
    p.add_argument("--rates", type=_floats, help="explicit rates, requests/s (override --fractions)")
    p.add_argument("--duration-s", type=float, default=20.0, help="each run: rate x this requests")
    p.add_argument("--min-requests", type=int, default=12)
    p.add_argument("--max-requests", type=int, default=400)
    p.add_argument("--repeats", type=int, default=2, help="real runs per rate")
    p.add_argument("--context", type=int, help="scale trace lengths to this many tokens "
                   "(default: max_model_len, else the model's context)")
    p.add_argument("--window-s", type=float, nargs=2, default=(0.0, 180.0), metavar=("START", "END"),
                   help="slice of the Azure trace (s)")
    p.add_argument("--trace-path", help="the Azure conversation CSV")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--num-gpu-blocks", type=int, default=512, help="KV blocks of both backends")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute")
    p.add_argument("--num-cpu-blocks", type=int, default=0,
                   help="host KV blocks for swap preemption (both backends)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, help="torch threads per engine (default: the calibration's)")
    p.add_argument("--serving-probe-requests", type=int, default=16,
                   help="requests of the short fixed load replayed through the real engine "
                   "before each run to re-measure its speed (0: none)")
    p.add_argument("--trace-probe-s", type=float, default=20.0,
                   help="seconds of arrivals of the same trace at the same rate (requests after "
                   "the validated ones) replayed before each run to re-measure its speed (0: none)")
    p.add_argument("--colocated-engine", choices=("process", "inproc"), default="process",
                   help="where the real colocated engine runs: a worker process behind ZMQ, as "
                   "kvpd serve runs it (default), or inside the validating process")
    p.add_argument("--serving-speed", action="store_true",
                   help="simulate each engine at the calibration's serving speed (measured by "
                   "its profile's serving probe); default: at the profile's isolated speed")
    p.add_argument("--seed", type=int, default=0)
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


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from realexec.fidelity.validate.plan import RunKnobs
    from realexec.fidelity.validate.report import (
        format_pd_steps,
        format_re_runs,
        format_table,
        write_report,
    )
    from realexec.fidelity.validate.validation import ValidateConfig, Validation

    for name in ("repeats", "min_requests", "max_requests", "num_gpu_blocks", "max_num_seqs"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.min_requests > args.max_requests:
        raise ValueError("--min-requests must not exceed --max-requests")
    if args.serving_probe_requests < 0:
        raise ValueError(f"--serving-probe-requests must be >= 0, got {args.serving_probe_requests}")
    if not args.trace_probe_s >= 0:
        raise ValueError(f"--trace-probe-s must be >= 0 (0: no trace probe), got {args.trace_probe_s}")
    if args.preemption_mode == "swap" and args.num_cpu_blocks < 1:
        raise ValueError("--preemption-mode swap needs --num-cpu-blocks >= 1 (a host KV pool)")
    knobs = RunKnobs(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                     num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size,
                     preemption_mode=args.preemption_mode, num_cpu_blocks=args.num_cpu_blocks,
                     max_model_len=args.max_model_len)
    cfg = ValidateConfig(
        calibration=Path(args.calibration), out=Path(args.out), model=args.model,
        traces=args.traces, modes=args.modes, fractions=args.fractions, rates=args.rates,
        duration_s=args.duration_s, min_requests=args.min_requests, max_requests=args.max_requests,
        repeats=args.repeats, context=args.context, window_s=tuple(args.window_s),
        trace_path=Path(args.trace_path) if args.trace_path else None, knobs=knobs,
        seed=args.seed, device=None if args.device == "auto" else args.device, threads=args.threads,
        serving_probe_requests=args.serving_probe_requests, trace_probe_s=args.trace_probe_s,
        colocated_engine=args.colocated_engine, serving_speed=args.serving_speed)
    if not cfg.calibration.is_file():
        raise FileNotFoundError(f"--calibration {cfg.calibration}: no such file (kvpd calibrate writes it)")
    v = Validation(cfg, progress=lambda m: print(m, flush=True))
    with _interruptible():
        summary = v.run()
    paths = write_report(cfg, v, summary)
    print(format_table({**summary}))
    if pd_steps := format_pd_steps(summary):
        print(pd_steps)
    refreshed = tuple(k for k in ("refreshed", "refreshed_trace", "refreshed_bracketed")
                      if any(r.get(k) for r in summary["results"]))
    if refreshed:
        print("\n" + format_re_runs(summary, refreshed))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 1 if summary["failures"] else 0
