"""`kvpd replay TRACE --target ...`: replay a trace against real serving (an in-process engine,
engine processes over ZeroMQ, or a running `kvpd serve`) and write the simulator's files."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvpd.commands.arg_types import non_negative_int, positive_float, positive_int
from kvpd.commands.serve_args import add_engine_args, serve_config


def _window(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window-s expects START:END seconds, got {text!r}") from None
    return a, b


def _arrival(text: str) -> dict:
    """A process name (`burst`) or a YAML mapping (`{process: poisson, rate: 4}`), checked."""
    import yaml

    from workloads.arrivals import validate_arrival

    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise argparse.ArgumentTypeError(f"--arrival: not valid YAML: {exc}") from None
    if isinstance(spec, str):
        spec = {"process": spec}
    try:
        return validate_arrival(spec, "--arrival")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a trace against real serving; writes summary.json + requests table",
        description="Send TRACE's requests at their arrival times (optionally rescaled) with "
        "synthetic token-id prompts of the trace's lengths (shared prefixes where the trace "
        "has hash ids), record client-side TTFT/TPOT/ITL/E2E and write the same summary.json "
        "and per-request table as `kvpd simulate`.",
    )
    p.add_argument("trace", help="trace file (any format `kvpd trace info` reads)")
    p.add_argument("--target", required=True,
                   help="inproc | engine | pd:P:D | http://HOST:PORT (a running kvpd serve)")
    p.add_argument("--format", default=None, help="trace format (default: detected)")
    t = p.add_argument_group("trace transforms (applied in this order)")
    t.add_argument("--window-s", type=_window, default=None, metavar="START:END")
    t.add_argument("--limit", type=positive_int, default=None, help="first N requests")
    t.add_argument("--scale-prompt", type=positive_float, default=1.0)
    t.add_argument("--scale-output", type=positive_float, default=1.0)
    t.add_argument("--time-scale", type=positive_float, default=None,
                   help="multiply arrival times (2 = half the rate)")
    t.add_argument("--rate", type=positive_float, default=None,
                   help="rescale to this mean rate (req/s)")
    t.add_argument("--arrival", type=_arrival, default=None, metavar="PROCESS",
                   help="replace the arrival times: burst (every request at t = 0, the "
                   "'infinite rate' of vllm bench serve / trtllm-bench) or an arrival mapping, "
                   "e.g. '{process: poisson, rate: 4}'")
    p.add_argument("--max-concurrency", type=positive_int, default=None, metavar="N",
                   help="closed loop: at most N requests in flight; the next is sent when one "
                   "finishes (TTFT counts from the send)")
    p.add_argument("--warmup-requests", type=non_negative_int, default=0, metavar="N",
                   help="the first N requests (trace order) run but stay out of the summary, "
                   "as a benchmark's warm-up requests (scenario key workload.warmup_requests)")
    p.add_argument("--warmup-drain", action="store_true",
                   help="with --warmup-requests: the measured requests start once every warm-up "
                   "request has finished, as vllm bench serve --num-warmups and "
                   "sglang.bench_serving run them (scenario key workload.warmup_drain)")
    p.add_argument("--served-model-name", default=None,
                   help="http target: the model name (default: the server's only model)")
    p.add_argument("--timeout-s", type=positive_float, default=600.0,
                   help="give up on requests unfinished this long after the last send")
    p.add_argument("--out", default=None, help="directory for summary.json and requests.*")
    p.add_argument("--records", default="parquet", choices=["parquet", "csv"])
    add_engine_args(p)
    p.set_defaults(func=run)


def _print_summary(s: dict) -> None:
    def ms(d: dict, k: str) -> str:
        v = d.get(k)
        return "-" if v is None else f"{v * 1000:.1f}"

    r = s["requests"]
    print(f"requests: {r['total']} total, {r['finished']} finished, {r['aborted']} failed/aborted, "
          f"{r['rejected']} rejected")
    for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        d = s[name]
        print(f"{name[:-2]:5s} ms: mean {ms(d, 'mean')}  p50 {ms(d, 'p50')}  p90 {ms(d, 'p90')}  "
              f"p99 {ms(d, 'p99')}")
    th = s["throughput"]
    print(f"throughput: {th['output_tokens_per_s']:.1f} output tok/s, {th['requests_per_s']:.2f} req/s "
          f"over {s['span_s']:.1f} s")
    if s.get("kv_transfer"):
        kv = s["kv_transfer"]
        print(f"kv transfer: {kv['count']} transfers, mean {kv['bytes_mean'] / 1e6:.2f} MB in "
              f"{kv['seconds_mean'] * 1000:.2f} ms ({kv['gbps_mean']:.2f} GB/s), {kv['lost']} lost")


def rejected_note(result: Any) -> str | None:
    """A line when the engine rejected requests it could never serve (their latencies are not
    in the figures), with its reason and the flags that change it; None when it rejected
    none."""
    from simulator.core.request import RequestStatus

    reqs = result.summary["requests"]
    if not reqs.get("rejected"):
        return None
    why = next((r.stop_reason for r in result.requests
                if r.status == RequestStatus.FINISHED_REJECTED and r.stop_reason), None)
    return (f"WARNING: {reqs['rejected']} of {reqs['total']} requests were rejected by the "
            f"engine, not served ({why or 'it gave no reason'}); the latency and throughput "
            "figures leave them out. --num-gpu-blocks and --block-size size the KV pool, "
            "--max-model-len the context")


def run(args: argparse.Namespace) -> int:
    import httpx

    import workloads
    from kvpd.cli import UserError
    from realexec.serving.replay.runner import (
        check_servable,
        check_warmup_requests,
        parse_target,
        prepare_trace,
        replay,
    )

    if args.out:  # a folder that can be written, before any engine starts
        from kvpd.commands.out_paths import check_out_dir

        check_out_dir(args.out, "--out")
    kind, detail = parse_target(args.target)
    trace = workloads.load_trace(args.trace, args.format)
    if args.warmup_requests:  # before the target starts (window and limit set the count)
        try:
            check_warmup_requests(args.warmup_requests,
                                  len(prepare_trace(trace, window_s=args.window_s, limit=args.limit)))
        except ValueError as exc:
            raise UserError(f"--warmup-requests, {args.trace}: {exc}") from None
    if args.warmup_drain and not args.warmup_requests:
        raise UserError("--warmup-drain waits for the warm-up requests: give --warmup-requests N "
                        "(N >= 1)")
    client = llm = None
    model = vocab = max_len = None
    try:
        if kind == "http":
            try:
                models = httpx.get(f"{detail}/v1/models", timeout=10).json()["data"]
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                raise UserError(f"--target {detail}: cannot list its models ({exc})") from None
            model = args.served_model_name or models[0]["id"]
            max_len = models[0].get("max_model_len")
            if args.served_model_name is None and len(models) != 1:
                raise UserError("the server has several models; pass --served-model-name")
            vocab = models[0].get("vocab_size")
            if not isinstance(vocab, int):
                raise UserError(f"--target {detail}: /v1/models gives no vocab_size (not a kvpd server?)")
        elif kind == "inproc":
            from realexec.engine.llm import LLM

            cfg = serve_config(args)
            llm = LLM(cfg.model, **cfg.llm_kwargs)
            max_len = llm.max_model_len
        else:
            from realexec.serving.client import EngineClient

            cfg = serve_config(args)
            if kind == "pd":
                cfg.pd = detail
            client = EngineClient(cfg).start()
            max_len = int(client.model_info["max_model_len"])
        trace = prepare_trace(trace, window_s=args.window_s, limit=args.limit,
                              scale_prompt=args.scale_prompt, scale_output=args.scale_output,
                              time_scale=args.time_scale, target_rate=args.rate,
                              max_model_len=max_len, arrival=args.arrival, seed=args.seed,
                              report=(clipped := {}))
        load = [f"--max-concurrency {args.max_concurrency}"] if args.max_concurrency else []
        load += ["--arrival burst"] if (args.arrival or {}).get("process") == "burst" else []
        info = (llm.scheduler.kv_cache_manager.limits() if llm is not None
                else client.model_info if client is not None else {})
        if load and info.get("num_gpu_blocks"):
            check_servable(trace, int(info["num_gpu_blocks"]), int(info["block_size"]),
                           " and ".join(load), int(info.get("sliding_window") or 0),
                           int(info.get("max_step_tokens") or 0))
        if clipped.get("clipped_prompts") or clipped.get("clipped_outputs"):
            print(f"warning: {clipped['clipped_prompts']} prompt(s) cut to fit max_model_len "
                  f"{max_len} (and {clipped['clipped_outputs']} output length(s)); counted in "
                  "the summary's replay section", file=sys.stderr, flush=True)
        print(f"replaying {len(trace)} requests of {trace.name!r} over {trace.duration_s:.1f} s "
              f"against {args.target}", flush=True)
        result = replay(trace, args.target, client=client, llm=llm, model=model,
                        vocab_size=vocab, seed=args.seed, timeout_s=args.timeout_s,
                        max_concurrency=args.max_concurrency,
                        warmup_requests=args.warmup_requests,
                        warmup_drain=args.warmup_drain, clipped=clipped)
    finally:
        if client is not None:
            client.close()
    _print_summary(result.summary)
    note = rejected_note(result)
    if note:
        print(note, file=sys.stderr, flush=True)
    if args.out:
        paths = result.write(args.out, args.records)
        print("wrote " + ", ".join(str(p) for p in paths))
    return 0
