"""vLLM's scheduler time per request per step, timed on this CPU from a released wheel.

V1's engine core steps as `schedule()` -> the model's step -> `update_from_output()`. With
synchronous scheduling (V1's default from v0.8.0 until async scheduling became the default in
v0.14.0) the GPU waits while both run, and both loop over the step's requests in Python. This
drives the wheel's own `Scheduler` (`vllm_v1_driver.py`, no model) through steady decoding of
N requests side by side and prints the median time of each call per step and per request,
against kvpd's price (`simulator/engines/vllm_host.py`: the mean per-request time over these
sizes, as timed on this repository's machine when it was set).

    # once: vLLM's wheel unpacked and an interpreter for it (see vllm_scheduler.py)
    python bench/diagnostics/vllm_host_cost.py --vllm /tmp/vllm-0.11.0 --python /tmp/vv/bin/python
    python bench/diagnostics/vllm_host_cost.py --engine v0 --vllm /tmp/vllm-0.7.3 --python ...

`--engine v0` times V0 (vLLM before 0.8, `vllm_v0_driver.py`) instead: its synchronous
`schedule()`, which also builds each group's `SequenceGroupMetadata`, and the token append
`LLMEngine._advance_to_next_step` runs before the next step under async output processing.

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

from simulator.engines.vllm_host import VLLM_V0_HOST_REQUEST_S, VLLM_V1_HOST_REQUEST_S

ENGINES = {  # engine -> (driver, the second call's name, kvpd's price, default sizes)
    "v1": ("vllm_v1_driver.py", "update", VLLM_V1_HOST_REQUEST_S, (16, 64, 256, 1024, 3200)),
    "v0": ("vllm_v0_driver.py", "append", VLLM_V0_HOST_REQUEST_S, (16, 64, 256, 1024)),
}


def timings(python: str, vllm_dir: str, sizes: tuple[int, ...],
            engine: str = "v1") -> list[tuple[int, float, float]]:
    """(requests, schedule s, the second call's s) per step for each size, from the wheel."""
    driver = Path(__file__).with_name(ENGINES[engine][0])
    env = {**os.environ, "PYTHONPATH": vllm_dir, "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([python, str(driver), json.dumps({"time": list(sizes)})], env=env,
                          text=True, capture_output=True, check=False)
    if done.returncode:
        sys.exit(f"vLLM's side failed:\n{done.stderr[-3000:]}")
    return [tuple(r) for r in json.loads(done.stdout.strip().splitlines()[-1])["timing"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", required=True, help="folder holding an unpacked vLLM wheel")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter that can import that vLLM (default: this one)")
    ap.add_argument("--engine", choices=sorted(ENGINES), default="v1",
                    help="the wheel's engine: v1 (vLLM 0.8 on, default) or v0 (before 0.8)")
    ap.add_argument("--sizes", default=None,
                    help="requests decoding side by side, comma-separated (default: "
                         + "; ".join(f"{e} {','.join(map(str, v[3]))}" for e, v in ENGINES.items())
                         + ")")
    a = ap.parse_args()
    _, second, price, default = ENGINES[a.engine]
    sizes = tuple(int(x) for x in a.sizes.split(",")) if a.sizes else default
    rows = timings(a.python, a.vllm, sizes, a.engine)
    print(f"vLLM {a.engine.upper()} scheduler from {a.vllm}: median per step in steady decoding")
    print(f"{'requests':>9} {'schedule ms':>12} {second + ' ms':>10} {'us/request':>11}")
    per = []
    for n, s, u in rows:
        per.append((s + u) / n)
        print(f"{n:>9} {s * 1e3:>12.3f} {u * 1e3:>10.3f} {per[-1] * 1e6:>11.2f}")
    mean = sum(per) / len(per)
    print(f"mean {mean * 1e6:.2f} us per request per step; kvpd's price "
          f"{price * 1e6:.2f} us (measured / kvpd {mean / price:.2f})")


if __name__ == "__main__":
    main()
