"""vLLM V1's scheduler time per request per step, timed on this CPU from a released wheel.

V1's engine core steps as `schedule()` -> the model's step -> `update_from_output()`. With
synchronous scheduling (V1's default from v0.8.0 until async scheduling became the default in
v0.14.0) the GPU waits while both run, and both loop over the step's requests in Python. This
drives the wheel's own `Scheduler` (`vllm_v1_driver.py`, no model) through steady decoding of
N requests side by side and prints the median time of each call per step and per request,
against kvpd's price (`simulator/engines/vllm_host.py`: the mean per-request time over these
sizes, as timed on this repository's machine when it was set).

    # once: vLLM's wheel unpacked and an interpreter for it (see vllm_scheduler.py)
    python bench/diagnostics/vllm_host_cost.py --vllm /tmp/vllm-0.11.0 --python /tmp/vv/bin/python

Only the scheduler is timed: the model runner's input preparation and the sampler's
bookkeeping also run per request between GPU steps and are not in it, so the price is a lower
bound of V1's exposed host time. It scales with the CPU's single-thread speed: vLLM PR #46112
timed `update_from_output` alone at 0.142 ms (128 requests) and 0.287 ms (256) on its machine,
where this one takes about 1.26x as long (0.18 and 0.36 ms on 0.17.0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from simulator.engines.vllm_host import VLLM_V1_HOST_REQUEST_S

DRIVER = Path(__file__).with_name("vllm_v1_driver.py")
SIZES = (16, 64, 256, 1024, 3200)


def timings(python: str, vllm_dir: str, sizes: tuple[int, ...]) -> list[tuple[int, float, float]]:
    """(requests, schedule s, update_from_output s) per step for each size, from the wheel."""
    env = {**os.environ, "PYTHONPATH": vllm_dir, "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([python, str(DRIVER), json.dumps({"time": list(sizes)})], env=env,
                          text=True, capture_output=True, check=False)
    if done.returncode:
        sys.exit(f"vLLM's side failed:\n{done.stderr[-3000:]}")
    return [tuple(r) for r in json.loads(done.stdout.strip().splitlines()[-1])["timing"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", required=True, help="folder holding an unpacked vLLM wheel")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter that can import that vLLM (default: this one)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="requests decoding side by side, comma-separated")
    a = ap.parse_args()
    rows = timings(a.python, a.vllm, tuple(int(x) for x in a.sizes.split(",")))
    print(f"vLLM V1 scheduler from {a.vllm}: median per step in steady decoding")
    print(f"{'requests':>9} {'schedule ms':>12} {'update ms':>10} {'us/request':>11}")
    per = []
    for n, s, u in rows:
        per.append((s + u) / n)
        print(f"{n:>9} {s * 1e3:>12.3f} {u * 1e3:>10.3f} {per[-1] * 1e6:>11.2f}")
    mean = sum(per) / len(per)
    print(f"mean {mean * 1e6:.2f} us per request per step; kvpd's price "
          f"{VLLM_V1_HOST_REQUEST_S * 1e6:.2f} us (measured / kvpd {mean / VLLM_V1_HOST_REQUEST_S:.2f})")


if __name__ == "__main__":
    main()
