"""The Ray backend: a local Ray instance gives the same numbers as serial runs; an
unreachable address fails fast with a clear message before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvpd.cli import main
from simulator.plan.backends import RayBackend, check_ray_address, ray_endpoint
from simulator.plan.sweep import run_sweep
from simulator.plan.sweep_spec import load_sweep
from simulator.plan.worker import WALL_CLOCK_METRICS

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"


def write_sweep(tmp_path: Path) -> Path:
    f = tmp_path / "ray.yaml"
    f.write_text(yaml.safe_dump({
        "name": "ray", "base": str(QUICKSTART), "set": {"workload.limit": 80},
        "axes": {"scheduler.max_num_batched_tokens": [512, 8192],
                 "workload.target_rate": [4.0, 16.0]}}))
    return f


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'kvpd[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_local_ray_gives_the_same_numbers_as_serial(local_ray, tmp_path):
    spec = load_sweep(write_sweep(tmp_path))
    backend = RayBackend()  # joins the running local instance
    assert backend.workers == 2
    on_ray = run_sweep(spec, tmp_path / "ray", backend=backend, progress=False)
    serial = run_sweep(spec, tmp_path / "serial", backend="serial", progress=False)
    assert on_ray.ran == 4 and on_ray.failed == 0 and on_ray.backend == "ray"
    skip = {"point_wall_s", *WALL_CLOCK_METRICS}
    for a, b in zip(on_ray.rows, serial.rows):
        assert {k: v for k, v in a.items() if k not in skip} == \
            {k: v for k, v in b.items() if k not in skip}
    assert local_ray.is_initialized()  # a backend that joined does not shut Ray down


def test_ray_resume_skips_points_done_elsewhere(local_ray, tmp_path):
    spec = load_sweep(write_sweep(tmp_path))
    run_sweep(spec, tmp_path / "out", backend="serial", progress=False)
    again = run_sweep(spec, tmp_path / "out", backend=RayBackend(), progress=False)
    assert (again.ran, again.skipped) == (0, 4)


@pytest.mark.parametrize("address, expected", [
    ("10.0.0.5:6379", ("10.0.0.5", 6379)),
    ("head-node", ("head-node", 6379)),
    ("ray://head:10001", ("head", 10001)),
    ("ray://head", ("head", 10001)),
    ("[::1]:7000", ("::1", 7000)),
    ("auto", None),
])
def test_ray_endpoint_parsing(address, expected):
    assert ray_endpoint(address) == expected


def test_bad_ray_address_is_refused():
    with pytest.raises(ValueError, match="port must be 1-65535"):
        ray_endpoint("head:99999")
    with pytest.raises(ValueError, match="no host"):
        ray_endpoint(":6379")


def test_unreachable_ray_address_fails_fast_before_any_work(tmp_path, capsys):
    # port 1 on this host: nothing listens, the connection is refused at once
    with pytest.raises(ValueError, match=r"cannot reach the Ray cluster at '127\.0\.0\.1:1'.*"
                                         r"ray start --head"):
        check_ray_address("127.0.0.1:1", timeout_s=0.5)
    f = write_sweep(tmp_path)
    out = tmp_path / "never"
    rc = main(["sweep", str(f), "--backend", "ray", "--address", "127.0.0.1:1",
               "--connect-timeout", "0.5", "--out", str(out), "--no-progress"])
    assert rc == 2
    assert "cannot reach the Ray cluster" in capsys.readouterr().err
    assert not out.exists()  # no results folder: nothing started
