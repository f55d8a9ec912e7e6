"""`kvpd serve` as a supervisor sees it: start-up checks, a dying worker (exit 1 after telling
the clients, or a restart with `--restart-workers`), SIGTERM's drain, and no folder left."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.serving_helpers import wait_for

MODEL = "tiny"
BASE = ["--model", "tiny-llama", "--served-model-name", MODEL, "--num-threads", "1",
        "--block-size", "4", "--max-num-batched-tokens", "64"]


class Serve:
    """A `kvpd serve` subprocess with its own TMPDIR (to see what it leaves there)."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        self.log_path = tmp_path / "serve.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in close()
        env = {**os.environ, "TMPDIR": str(self.tmp)}
        self.proc = subprocess.Popen([sys.executable, "-m", "kvpd.cli", "serve", *BASE,
                                      "--port", str(self.port), *args], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def kvpd_left(self) -> list[Path]:
        """kvpd's folders in its TMPDIR (torch keeps its own caches there too)."""
        return sorted(p for p in self.tmp.iterdir() if p.name.startswith("kvpd"))

    def text(self) -> str:
        return self.log_path.read_text()

    def health(self) -> int:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code
        except httpx.HTTPError:
            assert self.proc.poll() is None, self.text()
            return 0

    def up(self) -> Serve:
        wait_for(lambda: self.health() == 200, 120, "kvpd serve to come up")
        return self

    def pid_of(self, worker: str) -> int:
        return httpx.get(f"{self.url}/health").json()["workers"][worker]["pid"]

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()


def _stream_events(url: str, body: dict, on_event=None) -> list[str]:
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line)
                if on_event is not None:
                    on_event(len(events))
    return events


LONG = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 300, "ignore_eos": True, "stream": True}


@pytest.mark.slow
def test_a_dead_worker_makes_the_server_exit_1_after_telling_its_clients(tmp_path):
    s = Serve(tmp_path).up()
    try:
        pid = s.pid_of("engine-0")
        events = _stream_events(s.url, LONG, lambda n: n == 3 and os.kill(pid, signal.SIGKILL))
        assert '"error"' in events[-2] and "engine-0 is down" in events[-2], events[-3:]
        assert events[-1] == "data: [DONE]"
        assert s.proc.wait(30) == 1, s.text()
        assert "exiting with status 1" in s.text()
        assert s.kvpd_left() == []  # the socket folder is gone
    finally:
        s.close()


@pytest.mark.slow
def test_restart_workers_serves_again_and_sigterm_drains(tmp_path):
    # 100 blocks x 4 tokens < the model's 512: the advertised context is lowered, with a warning
    s = Serve(tmp_path, "--num-gpu-blocks", "100", "--restart-workers",
              "--shutdown-timeout", "0").up()
    try:
        assert "max_model_len lowered from 512 to 400" in s.text()
        r = httpx.post(f"{s.url}/v1/completions", json={"model": MODEL, "prompt": [5] * 450})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        pid = s.pid_of("engine-0")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: s.health() == 503, 10, "/health to say 503")
        wait_for(lambda: s.health() == 200, 120, "the restarted worker")
        h = httpx.get(f"{s.url}/health").json()["workers"]["engine-0"]
        assert h["restarts"] == 1 and h["pid"] != pid
        r = httpx.post(f"{s.url}/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": [5, 6], "max_tokens": 3})
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 3
        assert "kvpd:worker_restarts_total" in httpx.get(f"{s.url}/metrics").text
        # SIGTERM with a stream running and no drain time: it ends with an error event
        events = _stream_events(s.url, LONG, lambda n: n == 3 and s.proc.send_signal(signal.SIGTERM))
        assert '"error"' in events[-2] and "shutting down" in events[-2], events[-3:]
        assert events[-1] == "data: [DONE]"
        assert s.proc.wait(30) == 0, s.text()
        assert s.kvpd_left() == [] and "Traceback" not in s.text()
    finally:
        s.close()


@pytest.mark.slow
def test_start_up_refuses_a_context_the_pool_cannot_hold(tmp_path):
    s = Serve(tmp_path, "--num-gpu-blocks", "10", "--max-model-len", "512")
    try:
        assert s.proc.wait(120) == 2
        assert "--max-model-len 512 is larger than the 40 tokens" in s.text()
        assert s.kvpd_left() == []
    finally:
        s.close()


@pytest.mark.slow
def test_a_stale_socket_folder_is_removed_at_the_next_start(tmp_path):
    s = Serve(tmp_path).up()
    try:
        folders = s.kvpd_left()
        assert len(folders) == 1 and folders[0].name.startswith(f"kvpd-{s.proc.pid}-")
        os.killpg(s.proc.pid, signal.SIGKILL)  # no clean-up can run
        s.proc.wait(10)
        assert folders[0].exists()
        time.sleep(0.5)
    finally:
        s.close()
    from realexec.serving.ipc_dir import remove_stale

    assert remove_stale(str(s.tmp)) == folders and s.kvpd_left() == []


def _get_on(sock: socket.socket, path: str) -> bytes:
    """Send `GET path` on an open HTTP/1.1 connection; the response head and body."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection; got {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    size = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")))
    while len(body) < size:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection mid-body"
        body += chunk
    return head


@pytest.mark.slow
def test_an_idle_connection_outlives_the_clients_pool_keep_alive(tmp_path):
    # The cause of the soak's ReadErrors: uvicorn closed idle connections after 5 s, httpx
    # (and the openai client) reuse theirs for 5 s, so a request sent on a connection the
    # server was closing was reset before the server read it. The client must close first.
    s = Serve(tmp_path).up()
    try:
        with socket.create_connection(("127.0.0.1", s.port)) as sock:
            assert _get_on(sock, "/health").startswith(b"HTTP/1.1 200")
            time.sleep(httpx.Limits().keepalive_expiry + 1.0)  # idle past httpx's expiry
            assert _get_on(sock, "/health").startswith(b"HTTP/1.1 200")
    finally:
        s.close()


async def _streams_across_a_kill(s: Serve, n: int) -> tuple[list[tuple[str, list[str]]], dict]:
    """`n` clients sharing one httpx pool stream one request after another while the engine
    is SIGKILLed and restarted; each request's (status or transport error, its events)."""
    import asyncio

    ends: list[tuple[str, list[str]]] = []
    stop = asyncio.Event()
    body = {**LONG, "max_tokens": 24}
    times: dict[str, float] = {}
    token = asyncio.Event()  # set on every token event: a stream is in flight

    async def client(http: httpx.AsyncClient) -> None:
        while not stop.is_set():
            events: list[str] = []
            try:
                async with http.stream("POST", f"{s.url}/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") or r.status_code != 200:
                            events.append(line)
                        if line.startswith("data: {") and r.status_code == 200:
                            token.set()
                    ends.append((str(r.status_code), events))
            except httpx.HTTPError as exc:
                ends.append((f"transport error {type(exc).__name__}: {exc}", events))

    async def health(http: httpx.AsyncClient) -> int:
        return (await http.get(f"{s.url}/health")).status_code

    async with httpx.AsyncClient(timeout=60) as http:  # httpx's default pool (5 s keep-alive)
        tasks = [asyncio.create_task(client(http)) for _ in range(n)]
        engine = s.pid_of("engine-0")
        await asyncio.sleep(2.0)  # streams complete before the kill
        token.clear()  # kill while a stream is in flight, however slow this machine is
        await asyncio.wait_for(token.wait(), 60)
        os.kill(engine, signal.SIGKILL)
        times["kill"] = time.perf_counter()
        while await health(http) != 503:
            await asyncio.sleep(0.02)
        while await health(http) != 200:
            await asyncio.sleep(0.1)
        times["back"] = time.perf_counter()
        await asyncio.sleep(httpx.Limits().keepalive_expiry + 2.0)  # reuse idled connections
        stop.set()
        await asyncio.gather(*tasks)
    return ends, times


@pytest.mark.slow
def test_every_stream_across_a_worker_kill_ends_with_done_or_an_error(tmp_path):
    import asyncio

    s = Serve(tmp_path, "--restart-workers", "--no-access-log").up()
    try:
        ends, _ = asyncio.run(_streams_across_a_kill(s, 16))
        broken = [e for e in ends if e[0].startswith("transport error")]
        assert not broken, broken[:3]
        streamed = [ev for status, ev in ends if status == "200"]
        refused = [ev for status, ev in ends if status != "200"]
        for ev in streamed:  # tokens, maybe one error event, then [DONE]
            assert ev and ev[-1] == "data: [DONE]", ev[-3:]
            assert all('"error"' not in e for e in ev[:-2]), ev[-3:]
        for ev in refused:  # while the engine was down: 503 in OpenAI's error shape
            assert '"service_unavailable"' in "".join(ev), ev
        cut = [ev for ev in streamed if '"error"' in ev[-2]]
        assert cut and all("engine-0 is down" in ev[-2] for ev in cut), cut[:1]
        assert len(streamed) - len(cut) > 16  # streams completed before and after the restart
        text = httpx.get(f"{s.url}/metrics").text
        assert "kvpd:num_requests_in_flight{" in text
        assert re.search(r"^kvpd:num_requests_in_flight\{[^}]*\} 0\.0$", text, re.M), text
    finally:
        s.close()
