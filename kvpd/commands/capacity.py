"""`kvpd capacity SCENARIO.yaml --slo ttft_p90=0.5 --slo tpot_p90=0.05 [--attainment 0.9]
[--hardware a,b,c] [--cost-table FILE] [--peak-rate R] [--pd-ratios 1:1,1:3]`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity",
        help="find the highest request rate at which a scenario meets its SLOs",
        description="Bisect over the request rate (rescaling the scenario's trace) for the "
        "highest rate at which every SLO holds, with a confidence note from other samples of "
        "the traffic near the boundary. With --hardware and --peak-rate, report per candidate "
        "the max rate per replica, replicas and cost for the peak, and USD per million output "
        "tokens. Writes capacity.json into --out.",
    )
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC_STAT=SECONDS",
                   help="a latency limit, e.g. ttft_p90=0.5 or tpot_p99=0.1 (repeatable; "
                   "default: the scenario's slo block with --attainment 0.9)")
    p.add_argument("--attainment", type=float,
                   help="also require this fraction of requests to meet the ttft/tpot limits")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key (repeatable)")
    p.add_argument("--hardware", help="comma-separated accelerators to compare, e.g. h100-sxm,a100-80gb-sxm")
    p.add_argument("--cost-table", metavar="FILE", help="YAML mapping accelerator -> USD per hour "
                   "(overrides the catalog's price_per_hour)")
    p.add_argument("--peak-rate", type=float, metavar="RPS",
                   help="target peak request rate: report replicas, GPUs and USD/hour for it")
    p.add_argument("--pd-ratios", metavar="P:D,...", help="PD scenarios: P:D groups to compare, "
                   "e.g. 1:1,1:2,1:3")
    p.add_argument("--repeats", type=int, default=3,
                   help="other traffic samples replayed at the boundary (default 3)")
    p.add_argument("--tol", type=float, default=0.02, help="relative width of the final bracket")
    p.add_argument("--verify-step", type=float, default=0.1,
                   help="the answer x (1 + this) must fail (default 0.1)")
    p.add_argument("--max-sims", type=int, default=60, help="simulations per candidate at most")
    p.add_argument("--sim-timeout", type=float, metavar="S",
                   help="fail a candidate when one simulation runs longer than S seconds")
    p.add_argument("--workers", type=int, help="processes for several candidates (default: CPUs)")
    p.add_argument("--out", help="results folder (default runs/capacity/NAME)")
    p.add_argument("--json", action="store_true", help="print capacity.json")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines on stderr (one per simulation by default)")
    p.add_argument("--report", action="store_true", help="also write report.html")
    p.set_defaults(func=run)


def _num(v, fmt: str = ".4g") -> str:
    return "-" if v is None else format(v, fmt)


def format_result(result: dict) -> str:
    """A text table of the candidates and their notes."""
    head = ["candidate", "max req/s", "req/s/GPU", "GPUs/unit", "$/GPU-h", "$/M out tok"]
    peak = result.get("peak_rps")
    if peak:
        head += [f"units@{peak:g}", "GPUs@peak", "$/h@peak"]
    rows = []
    for c in result["candidates"]:
        gpus, usd_h = c.get("gpus_per_replica"), c.get("usd_per_hour_per_replica")
        per_gpu = usd_h / gpus if usd_h is not None and gpus else None
        row = [c["name"], _num(c.get("max_rate_rps")), _num(c.get("max_rate_per_gpu")),
               _num(gpus, "d"), _num(per_gpu, ".2f"), _num(c.get("usd_per_m_output_tokens"), ".3f")]
        if peak:
            row += [_num(c.get("replicas_for_peak"), "d"), _num(c.get("gpus_for_peak"), "d"),
                    _num(c.get("usd_per_hour_for_peak"), ".2f")]
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))  # noqa: E731
    out = [f"{result['name']}: {result['slo_text']} (unit: {result['unit']})"]
    if result.get("unit_note"):
        out.append(f"note: {result['unit_note']}")
    out += [line(head), line(["-" * w for w in widths]), *map(line, rows)]
    prices = sorted({c["price_assumption"] for c in result["candidates"] if c.get("price_assumption")})
    if prices:
        out.append(f"prices assumed: {'; '.join(prices)} (--cost-table FILE sets your own)")
    for c in result["candidates"]:
        notes = [c.get("error"), c.get("note"), c.get("cost_note"),
                 (c.get("confidence") or {}).get("note")]
        for n in filter(None, notes):
            out.append(f"  {c['name']}: {n}")
    out.append(f"best: {result['best'] or '-'}; {result['num_simulations']} simulations in "
               f"{result['wall_s']:.1f} s")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    import json

    from kvpd.commands.out_paths import check_out_dir
    from simulator.plan.candidates import (
        check_search_options,
        load_cost_table,
        parse_pd_ratios,
        plan_capacity,
        write_result,
    )
    from simulator.plan.slo import parse_slo, slo_set
    from simulator.scenario import load_scenario

    for text in args.slo:  # bad SLOs fail before the scenario is even read
        parse_slo(text)
    sc = load_scenario(args.scenario, args.overrides)
    slos = slo_set(args.slo, args.attainment, sc.slo)
    hardware = [h.strip() for h in args.hardware.split(",") if h.strip()] if args.hardware else None
    ratios = parse_pd_ratios(args.pd_ratios) if args.pd_ratios else None
    check_search_options(args.peak_rate, args.repeats, args.tol, args.verify_step,
                         args.max_sims, args.sim_timeout, args.workers)
    out_dir = check_out_dir(args.out or f"runs/capacity/{sc.name}", "--out")  # before the search
    result = plan_capacity(args.scenario, slos, overrides=args.overrides, hardware=hardware,
                           pd_ratios=ratios, peak_rps=args.peak_rate,
                           cost_table=load_cost_table(args.cost_table), repeats=args.repeats,
                           rel_tol=args.tol, verify_step=args.verify_step,
                           max_simulations=args.max_sims, workers=args.workers,
                           sim_timeout_s=args.sim_timeout, progress=not args.quiet)
    path = write_result(result, out_dir)
    print(json.dumps(result, indent=2, default=str) if args.json else format_result(result))
    print(f"wrote {path}")
    if args.report:
        from simulator.plan.report import write_report

        print(f"wrote {write_report(path.parent)}")
    return 0 if any(c.get("max_rate_rps") for c in result["candidates"]) else 1
