"""Is a batch's first decode step slower than the ones after it? (CPU)

    python bench/diagnostics/decode_first_step.py [--rounds N]

The profile grid (`realexec.fidelity.profile.profiler.Profiler._group`) times the first decode step of a
batch whose prompts it ran without computing them; a serving engine runs decode steps back
to back. For a few grid points, in shuffled rounds of one run, this times steps 1, 2 and
3-6 of the same batch and prints, per point, the median of each and step 1 / steps 3-6.
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

from realexec.fidelity.profile.profiler import FULL_BUDGET, Profiler

POINTS = [(1, 128), (1, 768), (2, 128), (4, 384), (8, 128), (16, 384), (32, 128)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as `kvpd profile` runs on this CPU
    prof = Profiler("llama-50m")
    times: dict[tuple[int, int], list[list[float]]] = {p: [] for p in POINTS}
    order = list(POINTS)
    rng = random.Random(0)
    for rnd in range(args.rounds + 1):  # round 0: warm-up
        rng.shuffle(order)
        for b, c in order:
            reqs = [prof._add(c - 1, 8) for _ in range(b)]
            prof._budget(b * c)
            prof._free_run(lambda reqs=reqs: all(r.num_output_tokens >= 1 for r in reqs))
            prof._budget(FULL_BUDGET)
            ts = [prof._timed_step()[0] for _ in range(6)]
            prof._drain()
            if rnd:
                times[(b, c)].append(ts)
    print(f"{'batch':>5} {'context':>7} {'step 1 ms':>9} {'step 2 ms':>9} {'3-6 ms':>8} {'1 / 3-6':>8}")
    for (b, c), runs in times.items():
        s1 = statistics.median(r[0] for r in runs)
        s2 = statistics.median(r[1] for r in runs)
        rest = statistics.median(t for r in runs for t in r[2:])
        print(f"{b:>5} {c:>7} {s1 * 1e3:>9.2f} {s2 * 1e3:>9.2f} {rest * 1e3:>8.2f} {s1 / rest:>8.3f}")


if __name__ == "__main__":
    main()
