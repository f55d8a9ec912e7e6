"""`kvpd serve`: an OpenAI-compatible HTTP server over engine processes (ZeroMQ), colocated or
prefill/decode disaggregated (`--pd P:D`).

Exit status: 0 after SIGINT/SIGTERM (stop accepting, drain for `--shutdown-timeout` s, end the
rest with an error event, stop the workers, remove the socket folder); 1 when a worker dies
and `--restart-workers` is off (the requests in flight get an error first), so a supervisor
restarts the server as it would `vllm serve`; 2 on bad options or a failed start-up check.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from typing import Any

from kvpd.commands.serve_args import add_engine_args, serve_config

# Default drain time after SIGTERM (s): Kubernetes' default terminationGracePeriodSeconds
# is 30 s; draining for 25 s leaves the workers' stop inside it.
DEFAULT_SHUTDOWN_TIMEOUT_S = 25.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over OpenAI-compatible HTTP (engine processes over ZeroMQ)",
        description="Start the engine worker processes (one colocated engine, or --pd P:D "
        "prefill and decode workers with KV transfer over ZeroMQ) and an HTTP server with "
        "/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, /version and, "
        "with a tokenizer, /tokenize and /detokenize.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients send (default: --model)")
    p.add_argument("--tokenizer", default=None,
                   help="directory with tokenizer files (default: the model directory, if it has them)")
    s = p.add_argument_group("server")
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (all routes but /health, /metrics, /version)")
    s.add_argument("--max-request-bytes", type=int, default=None,
                   help="larger request bodies get 413 (default 4 MiB)")
    s.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S,
                   help="on SIGTERM/SIGINT, drain requests for this many s, then end the rest "
                   "with an error (default 25)")
    s.add_argument("--timeout-keep-alive", type=float, default=None, metavar="S",
                   help="close a connection idle this long (default 75 s: longer than the "
                   "clients' pools keep theirs, so the client closes first)")
    s.add_argument("--restart-workers", action="store_true",
                   help="restart a worker that dies (default: the server exits with status 1)")
    s.add_argument("--heartbeat-timeout-s", type=float, default=30.0,
                   help="a worker silent this long is stalled: /health 503, no new requests")
    s.add_argument("--worker-kill-timeout-s", type=float, default=60.0,
                   help="a worker silent this long is killed (then restarted, or the server exits)")
    s.add_argument("--no-access-log", action="store_true", help="no log line per request")
    add_engine_args(p)
    p.set_defaults(func=run)


def _make_server(app: Any, args: argparse.Namespace, client: Any, state: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn with kvpd's shutdown: the first SIGINT/SIGTERM drains (new requests 503;
        after `--shutdown-timeout` s the rest end with an error event); a second one quits at
        once. Signals are not re-raised afterwards, so the workers are always stopped."""

        exit_code = 0
        _timer: threading.Timer | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                print(f"kvpd serve: signal {sig}: draining for up to {args.shutdown_timeout} s",
                      file=sys.stderr, flush=True)
                self._drain()
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

        def _drain(self) -> None:
            state.draining = True
            self._timer = threading.Timer(
                args.shutdown_timeout,
                lambda: client.abort_all("the server is shutting down", "shutdown"))
            self._timer.daemon = True
            self._timer.start()

        def worker_down(self, name: str, why: str) -> None:
            print(f"kvpd serve: worker {name} is down ({why}); exiting with status 1 "
                  "(--restart-workers restarts it instead)", file=sys.stderr, flush=True)
            self.exit_code = 1
            state.draining = True
            self.should_exit = True

    level = args.log_level.lower()
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=level,
                            timeout_graceful_shutdown=args.shutdown_timeout + 5.0,
                            timeout_keep_alive=args.timeout_keep_alive)
    return Server(config)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from kvpd.cli import UserError
    from realexec.engine.tokenizer import load_tokenizer
    from realexec.serving.client import EngineClient
    from realexec.serving.http.server import (
        DEFAULT_MAX_REQUEST_BYTES,
        DEFAULT_TIMEOUT_KEEP_ALIVE_S,
        ServerOptions,
        create_app,
    )
    from realexec.serving.startup import fit_max_model_len

    if not 0 <= args.port < 65536:
        raise UserError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_request_bytes is not None and args.max_request_bytes < 1:
        raise UserError(f"--max-request-bytes must be >= 1, got {args.max_request_bytes}")
    if not args.shutdown_timeout >= 0:
        raise UserError(f"--shutdown-timeout must be >= 0 s, got {args.shutdown_timeout}")
    if args.timeout_keep_alive is None:
        args.timeout_keep_alive = DEFAULT_TIMEOUT_KEEP_ALIVE_S
    if not 0 < args.timeout_keep_alive < float("inf"):
        raise UserError("--timeout-keep-alive must be > 0 s and finite, got "
                        f"{args.timeout_keep_alive}")
    config = serve_config(args)
    config.restart_workers = args.restart_workers
    config.heartbeat_timeout_s = args.heartbeat_timeout_s
    config.worker_kill_timeout_s = args.worker_kill_timeout_s
    config.__post_init__()  # check the timeouts
    tok_dir = args.tokenizer or (args.model if Path(args.model).is_dir() else None)
    if args.tokenizer and not Path(args.tokenizer).is_dir():
        raise UserError(f"--tokenizer {args.tokenizer}: not a directory")
    tokenizer = load_tokenizer(tok_dir)
    if args.tokenizer and tokenizer is None:
        raise UserError(f"--tokenizer {args.tokenizer}: no tokenizer.json / tokenizer_config.json")
    name = args.served_model_name or args.model
    if not args.no_access_log:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        access = logging.getLogger("kvpd.access")
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False
    roles = ", ".join(f"{n} ({r})" for n, r in config.worker_roles)
    print(f"kvpd serve: starting {roles} with {args.model} ...", flush=True)
    client = EngineClient(config).start()
    try:
        try:
            max_len, warning = fit_max_model_len({w.name: w.model for w in client.workers.values()},
                                                 args.max_model_len)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if warning:
            print(f"kvpd serve: warning: {warning}", file=sys.stderr, flush=True)
        opts = ServerOptions(max_request_bytes=args.max_request_bytes or DEFAULT_MAX_REQUEST_BYTES,
                             api_key=args.api_key, max_model_len=max_len,
                             access_log=not args.no_access_log)
        app = create_app(client, name, tokenizer, opts)
        server = _make_server(app, args, client, app.state.kvpd)
        client.on_worker_down = server.worker_down
        print(f"kvpd serve: serving {name!r} on http://{args.host}:{args.port}/v1 "
              f"({'text and token ids' if tokenizer else 'token ids only'}; "
              f"max_model_len {max_len})", flush=True)
        server.run()
    finally:
        client.close()
    return server.exit_code
