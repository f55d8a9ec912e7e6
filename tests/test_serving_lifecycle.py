"""`kvpd serve` as a supervisor sees it: start-up checks, a dying worker (exit 1 after telling
the clients, or a restart with `--restart-workers`), SIGTERM's drain, and no folder left."""

from __future__ import annotations

import os
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
