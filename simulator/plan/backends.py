"""Where sweep points run: in this process (`serial`), in a local process pool
(`process`, the default, sized to the machine) or on a Ray cluster (`ray`).

Every backend maps a picklable top-level function over a list of items and yields
`(index, ok, value)` as items finish, in completion order: `value` is the function's
result, or the error text when the item could not run at all (a worker died).

On a multi-node Ray cluster every node needs kvpd installed and the scenario's files
(traces, calibration) at the same absolute paths, e.g. on a shared file system: tasks
carry the scenario data, not the files it names.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

BACKENDS = ("process", "ray", "serial")
# Ray's defaults: GCS port 6379 (`ray start --head`), Ray Client port 10001 (ray:// URLs).
RAY_GCS_PORT = 6379
RAY_CLIENT_PORT = 10001
# Modules a pool worker imports once at start (forkserver preload) instead of per task.
PRELOAD = ["simulator.run", "simulator.plan.worker"]

Outcome = tuple[int, bool, Any]


class SerialBackend:
    """Run each item in this process, one after another."""

    name = "serial"

    def __init__(self) -> None:
        self.workers = 1

    def map_unordered(self, fn: Callable[[Any], Any], items: list[Any]) -> Iterator[Outcome]:
        for i, item in enumerate(items):
            yield i, True, fn(item)

    def close(self) -> None:
        pass


def _pool_context() -> multiprocessing.context.BaseContext:
    """forkserver where the platform has it (no fork of a threaded parent), else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


class ProcessBackend:
    """A local `ProcessPoolExecutor`; `workers` defaults to the machine's CPU count."""

    name = "process"

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"--workers must be >= 1, got {workers}")
        self.workers = workers or os.cpu_count() or 1

    def map_unordered(self, fn: Callable[[Any], Any], items: list[Any]) -> Iterator[Outcome]:
        if not items:
            return
        ex = ProcessPoolExecutor(min(self.workers, len(items)), mp_context=_pool_context())
        try:
            futures = {ex.submit(fn, item): i for i, item in enumerate(items)}
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    exc = f.exception()
                    if exc is None:
                        yield futures[f], True, f.result()
                    else:
                        yield futures[f], False, f"{type(exc).__name__}: {exc}"
        finally:
            ex.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        pass


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) to probe for a Ray address; None for "auto" / "local"."""
    if address in ("auto", "local"):
        return None
    rest, port = address, RAY_GCS_PORT
    if rest.startswith("ray://"):
        rest, port = rest[len("ray://"):], RAY_CLIENT_PORT
    rest = rest.rstrip("/")
    host = rest
    if rest.startswith("["):  # [ipv6]:port
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":"):
            port = _port(tail[1:], address)
    elif rest.count(":") == 1:
        host, text = rest.split(":")
        port = _port(text, address)
    if not host:
        raise ValueError(f"Ray address {address!r}: no host; expected HOST:PORT, ray://HOST:PORT "
                         f"or auto")
    return host, port


def _port(text: str, address: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"Ray address {address!r}: port must be 1-65535, got {text!r}")
    return int(text)


def check_ray_address(address: str, timeout_s: float) -> None:
    """Fail fast, with a clear message, when nothing listens at a Ray address."""
    endpoint = ray_endpoint(address)
    if endpoint is None:
        return
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except socket.gaierror as exc:
        reason = f"cannot resolve host {host!r} ({exc.strerror})"
    except TimeoutError:
        reason = f"no answer from {host}:{port} within {timeout_s:g} s"
    except OSError as exc:
        reason = f"{host}:{port}: {exc.strerror or exc}"
    raise ValueError(f"cannot reach the Ray cluster at {address!r}: {reason}. Start one with "
                     f"`ray start --head`, check the address, or omit --address to start a "
                     f"local Ray instance.")


class RayBackend:
    """Ray tasks (1 CPU each) on the cluster at `address`, or on a local instance."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None,
                 connect_timeout_s: float = 5.0) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError("--backend ray needs Ray: pip install 'kvpd[ray]'") from None
        self._ray = ray
        if address:
            check_ray_address(address, connect_timeout_s)
        self._owns = not ray.is_initialized()
        if self._owns:
            opts: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                    "logging_level": logging.WARNING}
            try:
                if address:
                    ray.init(address=address, **opts)
                else:
                    ray.init(num_cpus=workers, **opts)
            except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ...
                raise ValueError(f"could not start or join Ray at {address or 'a local instance'}: "
                                 f"{type(exc).__name__}: {exc}") from None
        self.workers = int(ray.cluster_resources().get("CPU", 1))

    def map_unordered(self, fn: Callable[[Any], Any], items: list[Any]) -> Iterator[Outcome]:
        ray = self._ray
        remote = ray.remote(num_cpus=1)(fn)
        refs = {remote.remote(item): i for i, item in enumerate(items)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        yield refs[ref], True, ray.get(ref)
                    except Exception as exc:  # a Ray task or worker failure
                        yield refs[ref], False, f"{type(exc).__name__}: {exc}"
        finally:
            for ref in pending:
                ray.cancel(ref)

    def close(self) -> None:
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()


def make_backend(name: str, *, workers: int | None = None, address: str | None = None,
                 connect_timeout_s: float = 5.0):
    """A backend by name; raises ValueError for bad names, options or an unreachable Ray."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if address and name != "ray":
        raise ValueError("--address applies to --backend ray only")
    if name == "ray":
        return RayBackend(address, workers, connect_timeout_s)
    if name == "process":
        return ProcessBackend(workers)
    return SerialBackend()
