"""`kvpd trace info|convert|synth|plot`: inspect, convert, generate and plot request traces."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from kvpd.commands.arg_types import non_negative_int, positive_float, positive_int
from kvpd.commands.trace_args import add_load_options, load_kwargs, parse_kv


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="inspect, convert, synthesize and plot request traces")
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)

    info = tsub.add_parser(
        "info", help="rows, span, rates, inter-arrival CV, lengths, prefix reuse"
    )
    info.add_argument("files", nargs="+", metavar="FILE")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_load_options(info)
    info.set_defaults(func=run, trace_func=_info)

    conv = tsub.add_parser(
        "convert",
        help="load (and merge) traces, transform, write the generic CSV/JSONL format",
        description="Transforms apply in this order: merge, --jitter, --window, --first, "
        "--max-model-len, --scale-prompt/--scale-output, --rate/--time-scale.",
    )
    conv.add_argument("files", nargs="+", metavar="FILE")
    conv.add_argument("-o", "--output", required=True, help="output .csv or .jsonl")
    conv.add_argument(
        "--jitter",
        nargs="?",
        const="auto",
        metavar="STEP_S",
        help="spread coarse timestamps over [t, t+STEP_S) (default step: smallest gap)",
    )
    conv.add_argument("--window", metavar="START:END", help="keep arrivals in [START, END) seconds")
    conv.add_argument("--first", type=positive_int, metavar="N", help="keep the first N requests")
    conv.add_argument("--max-model-len", type=positive_int, metavar="TOKENS")
    conv.add_argument(
        "--prompt-policy",
        choices=("reject", "clip"),
        default="reject",
        help="what --max-model-len does to longer prompts (default reject)",
    )
    conv.add_argument("--scale-prompt", type=positive_float, default=1.0, metavar="F")
    conv.add_argument("--scale-output", type=positive_float, default=1.0, metavar="F")
    rate = conv.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=positive_float, metavar="REQ_PER_S",
                      help="rescale to this mean rate")
    rate.add_argument("--time-scale", type=positive_float, metavar="F",
                      help="multiply arrival times by F")
    add_load_options(conv)
    conv.set_defaults(func=run, trace_func=_convert)

    syn = tsub.add_parser("synth", help="write a synthetic trace from flags or a YAML spec")
    syn.add_argument("-o", "--output", required=True, help="output .csv or .jsonl")
    syn.add_argument("--spec", help="YAML/JSON file with a synthesize spec (flags override it)")
    syn.add_argument("--spec-key", metavar="A.B", help="dotted key of the spec inside --spec")
    syn.add_argument("--name")
    syn.add_argument("--num-requests", type=int)
    syn.add_argument("--duration-s", type=float)
    syn.add_argument("--arrival", metavar="K=V,...", help="e.g. process=gamma,rate=5,cv=4")
    syn.add_argument(
        "--prompt-len", metavar="K=V,...", help="e.g. dist=lognormal,mean=600,sigma=0.8"
    )
    syn.add_argument("--output-len", metavar="K=V,...", help="e.g. dist=fixed,value=128")
    syn.add_argument(
        "--shared-prefix",
        metavar="K=V,...",
        help="e.g. num_prefixes=4,prefix_len=1024,fraction=0.5",
    )
    syn.add_argument("--seed", type=non_negative_int, default=0)
    syn.set_defaults(func=run, trace_func=_synth)

    plot = tsub.add_parser("plot", help="arrival rate over time and length histograms (PNG)")
    plot.add_argument("file", metavar="FILE")
    plot.add_argument("-o", "--output", required=True, help="output .png")
    plot.add_argument("--bucket-s", type=positive_float, help="rate bucket width in seconds (default: auto)")
    add_load_options(plot)
    plot.set_defaults(func=run, trace_func=_plot)


def run(args: argparse.Namespace) -> int:
    args.reported_warnings = set()  # warnings already printed inside a load report
    if getattr(args, "output", None):  # convert, synth, plot: writable, before any loading
        from kvpd.commands.out_paths import check_out_file

        check_out_file(args.output, "--output")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = args.trace_func(args)
    for w in caught:
        if str(w.message) not in args.reported_warnings:
            print(f"kvpd trace: warning: {w.message}", file=sys.stderr)
    return status


def _load(path: str, args: argparse.Namespace):  # noqa: ANN202 - returns a workloads.Trace
    from workloads import TraceError, load_trace

    try:
        trace = load_trace(path, args.format, **load_kwargs(args))
    except TraceError as exc:
        if not exc.skippable:
            raise
        raise ValueError(exc.hinted("--skip-invalid drops them")) from None
    _print_report(trace.load_report, args, force=args.skip_invalid)
    return trace


def _print_report(report: Any, args: argparse.Namespace, *, force: bool = False) -> None:
    """Print a LoadReport to stderr if anything was dropped or fixed up (or if `force`)."""
    if report is not None and (report.rows_dropped or report.warnings or force):
        print(report.summary(), file=sys.stderr)
        args.reported_warnings.update(report.warnings)


def _info(args: argparse.Namespace) -> int:
    from workloads import trace_stats

    results = []
    for path in args.files:
        trace = _load(path, args)
        stats = trace_stats(trace)
        stats["file"] = path
        stats["load_report"] = trace.load_report.to_dict() if trace.load_report else None
        results.append(stats)
    if args.json:
        print(json.dumps(_json_safe(results[0] if len(results) == 1 else results), indent=2))
    else:
        print("\n\n".join(_table(s) for s in results))
    return 0


def _json_safe(obj: Any) -> Any:
    """NaN (e.g. the rate of a one-request trace) -> null, so the output is strict JSON."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    return obj


def _table(s: dict[str, Any]) -> str:
    rep = s["load_report"] or {}
    lines = [
        f"{'file':18s} {s['file']} ({rep.get('format', '?')})",
        f"{'rows':18s} {s['rows']} (read {rep.get('rows_read', s['rows'])}, "
        f"dropped {rep.get('rows_dropped', 0)})",
    ]
    if not s["rows"]:
        return "\n".join([*lines, "(no requests: nothing to summarize)"])
    lines += [
        f"{'time span':18s} {s['duration_s']:.3f} s ({s['duration_s'] / 60:.2f} min)",
        f"{'rate mean':18s} {s['rate_rps_mean']:.3f} req/s = {s['rate_per_min_mean']:.1f} req/min",
        f"{'rate peak':18s} {s['rate_per_min_peak']} req/min "
        f"({s['rate_per_min_peak'] / 60:.2f} req/s, busiest 60-s bucket)",
        f"{'inter-arrival CV':18s} {s['interarrival_cv']:.3f}",
        "",
        f"{'tokens':12s}" + "".join(f"{h:>11s}" for h in ("mean", "p50", "p90", "p99", "max")),
    ]
    for col in ("prompt_len", "output_len"):
        st = s[col]
        lines.append(
            f"{col:12s}" + "".join(f"{st[k]:11.1f}" for k in ("mean", "p50", "p90", "p99", "max"))
        )
    px = s["prefix"]
    if px:
        lines += [
            "",
            f"prefix reuse (infinite cache, {px['block_size']}-token blocks, trace order):",
            f"  block hit ratio {px['block_hit_ratio']:.4f}, token hit ratio {px['token_hit_ratio']:.4f}, "
            f"requests with a hit {px['requests_with_hit']:.4f}, "
            f"unique blocks {px['unique_blocks']} of {px['total_blocks']}",
        ]
    return "\n".join(lines)


def _window(text: str) -> tuple[float, float]:
    start, sep, end = text.partition(":")
    try:
        return float(start), float(end)
    except ValueError:
        raise ValueError(f"--window: expected START:END in seconds, got {text!r}") from None


def _convert(args: argparse.Namespace) -> int:
    import workloads as w

    traces = [_load(path, args) for path in args.files]
    trace = traces[0] if len(traces) == 1 else w.merge_traces(traces)
    if args.jitter is not None:
        try:
            step = None if args.jitter == "auto" else float(args.jitter)
        except ValueError:
            raise ValueError(
                f"--jitter: expected a step in seconds or nothing, got {args.jitter!r} "
                "(put --jitter after the input files)"
            ) from None
        trace = w.jitter_arrivals(trace, step, seed=args.seed)
    if args.window:
        trace = w.time_window(trace, *_window(args.window))
    if args.first is not None:
        trace = w.first_n(trace, args.first)
    if args.max_model_len is not None:
        trace = w.limit_prompt_len(trace, args.max_model_len, mode=args.prompt_policy)
    if args.scale_prompt != 1.0 or args.scale_output != 1.0:
        trace = w.scale_lengths(trace, args.scale_prompt, args.scale_output)
    if args.rate is not None:
        trace = w.rescale_rate(trace, args.rate)
    if args.time_scale is not None:
        trace = w.scale_time(trace, args.time_scale)
    w.write_trace(trace, args.output)
    loaded = traces[0].load_report
    after = trace.load_report
    if len(traces) == 1 and loaded and after and after.rows_dropped > loaded.rows_dropped:
        print("after transforms:", file=sys.stderr)  # transforms dropped rows
        _print_report(after, args)
    print(f"wrote {len(trace)} requests ({trace.duration_s:.3f} s) to {args.output}")
    return 0


def _synth(args: argparse.Namespace) -> int:
    from workloads import synthesize, write_trace

    spec: dict[str, Any] = {}
    if args.spec:
        spec = _read_spec(Path(args.spec), args.spec_key)
    for key, flag in (
        ("arrival", args.arrival),
        ("prompt_len", args.prompt_len),
        ("output_len", args.output_len),
        ("shared_prefix", args.shared_prefix),
    ):
        if flag:
            spec[key] = parse_kv(flag, "--" + key.replace("_", "-"))
    if args.name:
        spec["name"] = args.name
    if args.num_requests is not None:
        spec.pop("duration_s", None)
        spec["num_requests"] = args.num_requests
    if args.duration_s is not None:
        spec.pop("num_requests", None)
        spec["duration_s"] = args.duration_s
    trace = synthesize(spec, args.seed)
    write_trace(trace, args.output)
    print(f"wrote {len(trace)} requests ({trace.duration_s:.3f} s) to {args.output}")
    return 0


def _read_spec(path: Path, key: str | None) -> dict[str, Any]:
    from simulator.yaml_file import read_yaml_mapping

    spec: Any = read_yaml_mapping(path, "--spec (trace synthesize spec)")
    for part in key.split(".") if key else []:
        if not isinstance(spec, dict) or part not in spec:
            raise ValueError(f"{path}: --spec-key {key!r}: no key {part!r}")
        spec = spec[part]
    if not isinstance(spec, dict):
        raise ValueError(
            f"{path}: expected a mapping with a synthesize spec, got {type(spec).__name__}"
        )
    return dict(spec)


def _plot(args: argparse.Namespace) -> int:
    from workloads import plot_trace

    trace = _load(args.file, args)
    plot_trace(trace, args.output, bucket_s=args.bucket_s)
    print(f"wrote {args.output}")
    return 0
