"""Soak of `kvpd serve` under mixed, partly hostile traffic:
python bench/serving_soak.py [--duration 600] [--pd 1:1] [--streams 64]

Two runs of the same valid load, side by side, each against its own `kvpd serve
--restart-workers` subprocess (TMPDIR pointed at a fresh folder, to see what it leaves):
(1) clean: `--streams` concurrent clients, each sending one streamed completion after another
    (token-id prompts of 8-64 tokens, 16-64 output tokens, greedy or sampled);
(2) soak: the same, plus bad requests of every class (strict-type, range, context, JSON,
    route, method, model errors; about 4 a second), clients that disconnect mid-stream (5 %
    of streams), one 100 MB body a minute (the first 10 s in), and one SIGKILL of the engine
    worker (`--pd`: the decode worker) half-way.
At the end of each: requests still in flight and KV usage from `/metrics` once the load
stopped; each valid request's ending (completed, error event / error status, or none: a
failure); the p99 inter-token latency of streams not hit by the kill against the clean run
(a stream is hit when it was open between the kill and 1 s after `/health` was 200 again);
the front end's peak resident memory (VmHWM); SIGTERM's exit status and leftover folders.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny-llama"  # 2 layers, vocab 256: 64 streams fit two shared CPU cores
VOCAB = 256
BIG_BODY_BYTES = 100 * 1024 * 1024  # the large body


def bad_requests() -> list[tuple[str, str, str, bytes]]:
    """(class, method, path, body) of every class of bad input."""
    ok = {"model": "soak", "prompt": [5, 6], "max_tokens": 2}
    bodies = {
        "wrong type": {**ok, "stream": "no"}, "truthy string": {**ok, "ignore_eos": "false"},
        "infinite": {**ok, "temperature": float("inf")}, "nan": {**ok, "top_p": float("nan")},
        "out of range": {**ok, "top_p": 2}, "seed overflow": {**ok, "seed": 2**70},
        "bad stop ids": {**ok, "stop_token_ids": ["a"]}, "bad token": {**ok, "prompt": [VOCAB]},
        "too long": {**ok, "prompt": [5] * 600}, "no model": {"prompt": [5]},
        "wrong model": {**ok, "model": "gpt-4"}, "unsupported": {**ok, "best_of": 2},
        "max_tokens 0": {**ok, "max_tokens": 0},
    }
    out = [(k, "POST", "/v1/completions", json.dumps(v).encode()) for k, v in bodies.items()]
    return out + [("not json", "POST", "/v1/completions", b"{nope"),
                  ("not an object", "POST", "/v1/completions", b"[1]"),
                  ("chat no messages", "POST", "/v1/chat/completions", b'{"model":"soak"}'),
                  ("no route", "GET", "/v1/nope", b""),
                  ("wrong method", "GET", "/v1/completions", b"")]


@dataclass
class Run:
    started: list[float] = field(default_factory=list)
    outcome: list[tuple[float, float, str, list[float]]] = field(default_factory=list)
    bad: dict[str, int] = field(default_factory=dict)
    bad_wrong: list[str] = field(default_factory=list)
    big: list[str] = field(default_factory=list)
    disconnected: int = 0
    transport: list[tuple[float, float, str, str]] = field(default_factory=list)
    t_start: float = 0.0


async def stream_client(http: httpx.AsyncClient, url: str, rng: random.Random, run: Run,
                        stop_at: float, chaos: bool) -> None:
    while time.perf_counter() < stop_at:
        body = {"model": "soak", "prompt": [rng.randrange(3, VOCAB) for _ in range(rng.randint(8, 64))],
                "max_tokens": rng.randint(16, 64), "ignore_eos": True, "stream": True,
                "temperature": rng.choice([0.0, 0.8])}
        leave_after = rng.randint(1, 10) if chaos and rng.random() < 0.05 else None
        t0 = time.perf_counter()
        times: list[float] = []
        ending = "none"
        answered = False  # the response's status line arrived
        try:
            async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
                answered = True
                if resp.status_code != 200:
                    await resp.aread()
                    ending = f"error {resp.status_code}"
                else:
                    async for line in resp.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        if line == "data: [DONE]":
                            break
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            ending = "error event"
                            continue
                        if chunk["choices"][0]["token_ids"]:
                            times.append(time.perf_counter())
                        if chunk["choices"][0]["finish_reason"]:
                            ending = "completed"
                        if leave_after is not None and len(times) >= leave_after:
                            ending = "disconnected"
                            break
        except httpx.HTTPError as exc:
            # before the status line: the request may never have reached the server (a
            # pooled connection it had closed); after it: the server dropped a stream
            where = "mid-stream" if answered else "before the response"
            ending = f"transport error {type(exc).__name__} {where}"
            run.transport.append((t0, time.perf_counter(), ending, repr(exc)[:120]))
        if ending == "disconnected":
            run.disconnected += 1
            continue
        run.outcome.append((t0, time.perf_counter(), ending, times))


async def bad_client(http: httpx.AsyncClient, url: str, rng: random.Random, run: Run,
                     stop_at: float) -> None:
    cases = bad_requests()
    while time.perf_counter() < stop_at:
        name, method, path, body = rng.choice(cases)
        try:
            r = await http.request(method, url + path, content=body,
                                   headers={"content-type": "application/json"})
            err = r.json().get("error", {})
            shaped = set(err) == {"message", "type", "param", "code"}
            if not (400 <= r.status_code < 500 and shaped):
                run.bad_wrong.append(f"{name}: {r.status_code} {r.text[:80]}")
        except (httpx.HTTPError, ValueError) as exc:
            run.bad_wrong.append(f"{name}: {type(exc).__name__}")
        run.bad[name] = run.bad.get(name, 0) + 1
        await asyncio.sleep(0.25)


async def big_client(url: str, run: Run, start: float, stop_at: float) -> None:
    body = b'{"model":"soak","max_tokens":1,"prompt":[' + b"5," * (BIG_BODY_BYTES // 2 - 50) + b"5]}"
    at = start + 10.0
    while at < stop_at:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        try:
            async with httpx.AsyncClient(timeout=60) as http:
                r = await http.post(f"{url}/v1/completions", content=body,
                                    headers={"content-type": "application/json"})
            run.big.append(str(r.status_code))
        except httpx.HTTPError as exc:
            run.big.append(type(exc).__name__)
        at += 60.0


async def killer(url: str, at: float, role: str, info: dict) -> None:
    await asyncio.sleep(max(0.0, at - time.perf_counter()))
    async with httpx.AsyncClient(timeout=10) as http:
        workers = (await http.get(f"{url}/health")).json()["workers"]
        name = next(n for n, w in workers.items() if w["role"] == role)
        os.kill(workers[name]["pid"], signal.SIGKILL)
        info.update(worker=name, t_kill=time.perf_counter())
        while time.perf_counter() - info["t_kill"] < 10:  # until the front end has seen it
            await asyncio.sleep(0.02)
            try:
                if (await http.get(f"{url}/health")).status_code == 503:
                    break
            except httpx.HTTPError:
                pass
        info["t_seen"] = time.perf_counter()
        while True:
            await asyncio.sleep(0.05)
            try:
                if (await http.get(f"{url}/health")).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
        info["t_back"] = time.perf_counter()


async def load(url: str, streams: int, duration: float, chaos: bool, kill_role: str,
               seed: int) -> tuple[Run, dict]:
    run, kill = Run(), {}
    rng = random.Random(seed)
    start = run.t_start = time.perf_counter()
    stop_at = start + duration
    limits = httpx.Limits(max_connections=streams + 16, max_keepalive_connections=streams + 16)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0)) as http:
        tasks = [stream_client(http, url, random.Random(rng.random()), run, stop_at, chaos)
                 for _ in range(streams)]
        if chaos:
            tasks += [bad_client(http, url, random.Random(rng.random()), run, stop_at),
                      big_client(url, run, start, stop_at),
                      killer(url, start + duration / 2, kill_role, kill)]
        await asyncio.gather(*tasks)
    return run, kill


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(pd: str | None, tmp: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "kvpd.cli", "serve", "--model", MODEL, "--port", str(port),
           "--served-model-name", "soak", "--num-threads", "1", "--block-size", "4",
           "--num-gpu-blocks", "2048", "--max-num-batched-tokens", "512", "--restart-workers",
           "--no-access-log", "--shutdown-timeout", "5"]
    if pd:
        cmd += ["--pd", pd]
    env = {**os.environ, "TMPDIR": tmp, "PYTHONPATH": str(REPO)}
    log = open(Path(tmp).parent / f"{Path(tmp).name}.log", "w")  # noqa: SIM115 - lives with proc
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kvpd serve exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("kvpd serve did not come up in 300 s")


def scrape(url: str) -> tuple[float, dict[str, float]]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    in_flight = float(re.search(r"^kvpd:num_requests_in_flight\{[^}]*\} (\S+)$", text, re.M).group(1))
    usage = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^vllm:kv_cache_usage_perc\{[^}]*worker="([^"]+)"[^}]*\} (\S+)$', text, re.M)}
    return in_flight, usage


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_run(pd: str | None, streams: int, duration: float, chaos: bool, seed: int) -> dict:
    base = tempfile.mkdtemp(prefix="kvpd-soak-")
    tmp = os.path.join(base, "tmp")
    os.mkdir(tmp)
    proc, url = start_server(pd, tmp)
    try:
        run, kill = asyncio.run(load(url, streams, duration, chaos, "decode" if pd else "colocated", seed))
        time.sleep(2.0)  # stats ride on the next heartbeat
        in_flight, usage = scrape(url)
        peak_mb = vm_hwm_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "killed after 60 s"
    left = sorted(d for d in os.listdir(tmp) if d.startswith("kvpd"))  # not torch's caches
    import shutil

    shutil.rmtree(base, ignore_errors=True)
    return {"run": run, "kill": kill, "in_flight": in_flight, "usage": usage, "peak_mb": peak_mb,
            "exit": code, "left": left}


def itls(outcome: list, exclude: tuple[float, float] | None) -> np.ndarray:
    gaps = []
    for t0, t1, ending, times in outcome:
        if ending != "completed":
            continue
        if exclude is not None and t0 <= exclude[1] and t1 >= exclude[0]:
            continue
        gaps.extend(np.diff(times))
    return np.asarray(gaps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load per run")
    ap.add_argument("--pd", default=None, metavar="P:D", help="serve disaggregated; kill the decode worker")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    mode = f"--pd {args.pd}" if args.pd else "colocated"
    print(f"serving soak: {mode}, {args.duration:.0f} s per run, {args.streams} streams, {MODEL}, "
          f"{os.cpu_count()} CPUs", flush=True)
    clean = one_run(args.pd, args.streams, args.duration, False, args.seed)
    soak = one_run(args.pd, args.streams, args.duration, True, args.seed)
    for name, r in (("clean", clean), ("soak", soak)):
        ends: dict[str, int] = {}
        kinds: dict[str, int] = {}
        for *_, ending, _t in r["run"].outcome:
            key = "completed" if ending == "completed" else ("no ending" if ending == "none" else "errored")
            ends[key] = ends.get(key, 0) + 1
            if key == "errored":
                kinds[ending] = kinds.get(ending, 0) + 1
        print(f"[{name}] valid requests: {len(r['run'].outcome)} ended by the server: "
              f"{ends.get('completed', 0)} completed, {ends.get('errored', 0)} errored, "
              f"{ends.get('no ending', 0)} with no ending; {r['run'].disconnected} left by their "
              f"client on purpose" + (f"; errors: {kinds}" if kinds else ""))
        for t0, t1, ending, exc in r["run"].transport:
            print(f"[{name}]   {ending}: sent at {t0 - r['run'].t_start:.2f} s, failed at "
                  f"{t1 - r['run'].t_start:.2f} s: {exc}")
        print(f"[{name}] leaked after the load: in-flight {r['in_flight']:.0f}, KV usage "
              + ", ".join(f"{w} {u:.3f}" for w, u in sorted(r["usage"].items())))
        print(f"[{name}] front end peak memory (VmHWM): {r['peak_mb']:.0f} MB; SIGTERM exit "
              f"status {r['exit']}; kvpd folders left in TMPDIR: {r['left'] or 'none'}")
    run, kill = soak["run"], soak["kill"]
    print(f"[soak] bad requests: {sum(run.bad.values())} of {len(run.bad)} classes, answered "
          f"4xx in OpenAI's error shape: {sum(run.bad.values()) - len(run.bad_wrong)}"
          + (f"; wrong: {run.bad_wrong[:5]}" if run.bad_wrong else ""))
    print(f"[soak] 100 MB bodies: {len(run.big)} sent, answers {run.big}")
    hit = None
    if kill:
        hit = (kill["t_kill"], kill.get("t_back", kill["t_kill"]) + 1.0)
        n_hit = sum(1 for t0, t1, *_ in run.outcome if t0 <= hit[1] and t1 >= hit[0])
        print(f"[soak] killed {kill['worker']} at {args.duration / 2:.0f} s; /health 503 after "
              f"{kill['t_seen'] - kill['t_kill']:.2f} s, 200 again after "
              f"{kill.get('t_back', float('nan')) - kill['t_kill']:.1f} s; {n_hit} valid requests "
              "open in that window (left out of the soak's ITL)")
    a, b = itls(clean["run"].outcome, None), itls(run.outcome, hit)
    pa, pb = float(np.percentile(a, 99)), float(np.percentile(b, 99))
    print(f"p99 inter-token latency: clean {pa * 1000:.1f} ms ({len(a)} gaps), soak streams not "
          f"hit by the kill {pb * 1000:.1f} ms ({len(b)} gaps): ratio {pb / pa:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
