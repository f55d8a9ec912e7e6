"""Helpers for the serving tests: tiny fp32 engines in worker processes, bounded waits, and a
raw ZeroMQ harness that talks to one engine process directly."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq

from realexec.serving.config import ServeConfig, spawn_worker
from realexec.serving.transport import Message, decode, encode
from realexec.serving.worker_spec import WorkerSpec

TINY = "tiny-llama"  # 2 layers, hidden 64, vocab 256 (realexec.engine.configs)
TINY_KWARGS: dict[str, Any] = {"num_gpu_blocks": 512, "block_size": 4, "max_num_batched_tokens": 64}
STARTUP_S = 120.0  # spawning a worker imports torch + transformers (several s on 2 busy cores)
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def tiny_config(**kw: Any) -> ServeConfig:
    kw.setdefault("model", TINY)
    kw.setdefault("llm_kwargs", dict(TINY_KWARGS))
    kw.setdefault("num_threads", 1)
    kw.setdefault("heartbeat_s", 0.05)
    kw.setdefault("startup_timeout_s", STARTUP_S)
    return ServeConfig(**kw)


def prompts(seed: int, lengths: list[int], vocab: int = 256) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def reference(prompt_list: list[list[int]], max_tokens: int, model: str = TINY,
              **options: Any) -> list[list[int]]:
    """Greedy outputs of the colocated in-process engine (same model and seeds; `options`
    are more sampling options), computed on one torch thread (a tiny model on several
    threads of a busy machine is ~100x slower)."""
    import torch

    from realexec.engine.llm import LLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(model, **TINY_KWARGS)
        outs = llm.generate(prompt_list, {**GREEDY, "max_tokens": max_tokens, **options})
    finally:
        torch.set_num_threads(threads)
    return [o.token_ids for o in outs]


def save_tiny_tokenizer(directory: str, vocab_size: int = 256) -> None:
    """A word-level tokenizer for the tiny models: token i is the word `t{i}` (0-2 special)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")
    fast.save_pretrained(directory)


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll `pred` until it is truthy; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def paused(pid: int):
    """SIGSTOP a worker for the block (so a request cannot finish on its own meanwhile)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def pool_whole(stats: dict[str, Any]) -> bool:
    """A worker's stats say every KV block is free and nothing is held or in flight."""
    return (stats.get("num_free_blocks") == stats.get("num_gpu_blocks")
            and not stats.get("num_running") and not stats.get("num_waiting")
            and not stats.get("num_waiting_for_kv") and not stats.get("num_transferring")
            and not stats.get("kv_held") and not stats.get("kv_staged"))


def all_pools_whole(client: Any, since: float = 0.0) -> bool:
    """Every live worker's stats, received after `since` (perf_counter s), say its pool is whole."""
    return all(pool_whole(w["stats"]) and w["stats_at"] > since
               for w in client.workers_status().values() if w["alive"])


def wait_pools_whole(client: Any, timeout_s: float = 10.0) -> dict[str, dict[str, Any]]:
    """Wait for stats newer than now that show every live pool whole; returns the status."""
    since = time.perf_counter()
    wait_for(lambda: all_pools_whole(client, since), timeout_s,
             "every live worker to report a whole KV pool")
    return client.workers_status()


class RawEngine:
    """One colocated engine process driven over raw sockets (the test is its front end)."""

    def __init__(self, **spec_kw: Any) -> None:
        self.ctx = zmq.Context()
        self.dir = tempfile.mkdtemp(prefix="kvpd-test-")
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(f"ipc://{self.dir}/out")
        self.tokens: dict[str, list[int]] = {}
        self.final: dict[str, tuple[dict, Message]] = {}
        spec = WorkerSpec(name="raw-0", output_addr=f"ipc://{self.dir}/out", ipc_dir=self.dir,
                          llm_kwargs={"model": TINY, **TINY_KWARGS}, num_threads=1,
                          heartbeat_s=0.05, parent_pid=os.getpid(), **spec_kw)
        self.proc = spawn_worker(spec)
        ready = self.recv(STARTUP_S, lambda m: m.type in ("ready", "fatal"))
        assert ready.type == "ready", ready.body
        self.model = ready.body["model"]
        self.input_addr = ready.body["endpoints"]["input"]
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.connect(self.input_addr)

    def send(self, msg_type: str, body: dict[str, Any]) -> None:
        self.push.send_multipart(encode(msg_type, body))

    def send_frames(self, frames: list[bytes]) -> None:
        self.push.send_multipart(frames)

    def recv(self, timeout_s: float, pred: Callable[[Message], bool] = lambda m: True) -> Message:
        """The next message satisfying `pred` (others are skipped, their items recorded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.pull.poll(int(left * 1000)):
                raise AssertionError(f"no matching message from the engine within {timeout_s} s")
            msg = decode(self.pull.recv_multipart())
            if msg.type == "outputs":
                for item in msg.body["items"]:
                    self.tokens.setdefault(item["id"], []).extend(item["tok"])
                    if item["fin"] is not None:
                        self.final[item["id"]] = (item, msg)
            if pred(msg):
                return msg

    def items_until(self, rid: str, timeout_s: float) -> tuple[list[int], dict, Message]:
        """All tokens of `rid` once it finished; returns (tokens, final item, its message)."""
        deadline = time.monotonic() + timeout_s
        while rid not in self.final:
            self.recv(max(0.01, deadline - time.monotonic()), lambda m: m.type == "outputs")
        item, msg = self.final[rid]
        return self.tokens.get(rid, []), item, msg

    def close(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        self.ctx.destroy(linger=0)
        shutil.rmtree(self.dir, ignore_errors=True)
