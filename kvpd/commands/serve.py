"""`kvpd serve`: an OpenAI-compatible HTTP server over engine processes (ZeroMQ), colocated or
prefill/decode disaggregated (`--pd P:D`)."""

from __future__ import annotations

import argparse

from kvpd.commands.serve_args import add_engine_args, serve_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over OpenAI-compatible HTTP (engine processes over ZeroMQ)",
        description="Start the engine worker processes (one colocated engine, or --pd P:D "
        "prefill and decode workers with KV transfer over ZeroMQ) and an HTTP server with "
        "/v1/completions, /v1/chat/completions, /v1/models, /health and /metrics.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: --model)")
    p.add_argument("--tokenizer", default=None,
                   help="directory with tokenizer files (default: the model directory, if it has them)")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import uvicorn

    from kvpd.cli import UserError
    from realexec.serving.client import EngineClient
    from realexec.serving.http.server import create_app, load_tokenizer

    if not 0 <= args.port < 65536:
        raise UserError(f"--port must be in [0, 65535], got {args.port}")
    config = serve_config(args)
    tok_dir = args.tokenizer or (args.model if Path(args.model).is_dir() else None)
    if args.tokenizer and not Path(args.tokenizer).is_dir():
        raise UserError(f"--tokenizer {args.tokenizer}: not a directory")
    tokenizer = load_tokenizer(tok_dir)
    if args.tokenizer and tokenizer is None:
        raise UserError(f"--tokenizer {args.tokenizer}: no tokenizer.json / tokenizer_config.json")
    name = args.served_model_name or args.model
    roles = ", ".join(f"{n} ({r})" for n, r in config.worker_roles)
    print(f"kvpd serve: starting {roles} with {args.model} ...", flush=True)
    client = EngineClient(config).start()
    try:
        print(f"kvpd serve: serving {name!r} on http://{args.host}:{args.port}/v1 "
              f"({'text and token ids' if tokenizer else 'token ids only'})", flush=True)
        uvicorn.run(create_app(client, name, tokenizer), host=args.host, port=args.port,
                    log_level=args.log_level.lower() if args.log_level.upper() != "WARNING" else "warning")
    finally:
        client.close()
    return 0
