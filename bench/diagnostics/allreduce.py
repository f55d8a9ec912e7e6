"""kvpd's TP all-reduce time per call against published communicator benchmarks (one call of
S bytes among tp GPUs, the serving engines' own kernels: vLLM's custom all-reduce, symmetric
memory and NCCL under CUDA graphs, TensorRT-LLM-style one-/two-shot kernels in SGLang).

Each row prints the measured time, kvpd's (`allreduce_seconds` with the link's fit from
`links.yaml`) and the ring of 2 (tp - 1) hop latencies at `comm_efficiency` 0.8 that kvpd
used before the fit.

    python bench/diagnostics/allreduce.py

The nvlink4 and infinity-fabric-mi300 fits are least squares over the first two tables, and
nvlink4's large-message line (NCCL above tens of MB: `large_allreduce_*`) comes from the third;
the fourth (small messages, no CUDA graphs) is shown as a check, not fitted to.
"""

from __future__ import annotations

import dataclasses

from simulator.cost.collectives import allreduce_seconds
from simulator.cost.hardware import get_link
from simulator.cost.params import CostParams

MIB, KIB = 2**20, 2**10
# (label, link, source, [(tp, bytes, measured us)])
TABLES = [
    ("H100, fastest of vLLM's all-reduces per size (CUDA graphs)", "nvlink4",
     "vLLM PRs #24532 (TP4) and #24111 (TP2, TP6): benchmark_device_communicators.py",
     [(2, 0.5 * MIB, 7.0)]
     + [(4, s * MIB, t) for s, t in ((0.5, 10), (1, 14), (1.5, 19), (2, 21), (3, 23), (4, 28))]
     + [(6, s * MIB, t) for s, t in ((0.5, 13), (1, 16), (1.5, 18), (2, 21), (3, 25), (4, 31))]),
    ("MI300X TP4, custom all-reduce", "infinity-fabric-mi300",
     "SGLang PR #6619, 'baseline' column",
     [(4, s, t) for s, t in ((2 * KIB, 7.18), (16 * KIB, 7.26), (32 * KIB, 7.58),
                             (256 * KIB, 14.39), (512 * KIB, 14.65), (1 * MIB, 22.91),
                             (2 * MIB, 36.64), (4 * MIB, 63.86), (8 * MIB, 118.31))]),
    ("H100 TP8, NCCL on large messages (a prefill's hidden states)", "nvlink4",
     "vLLM PR #42324, its last SM 9.0 table (world size 8), pynccl column; NVLink SHARP's "
     "~275 GB/s algbw from nccl-tests issue #212",
     [(8, s * MIB, t) for s, t in ((16, 121), (32, 195), (47.84, 267), (64, 316), (128, 561))]),
    ("H100, TensorRT-LLM-style one-shot kernel, no CUDA graphs (not fitted)", "nvlink4",
     "SGLang PR #2904, 'custom allreduce' table",
     [(tp, s, t) for s, ts in ((512, (3.7, 4.8, 5.9)), (4 * KIB, (3.9, 3.7, 5.7)),
                               (32 * KIB, (4.5, 4.8, 7.8)), (256 * KIB, (7.9, 13.9, 16.7)),
                               (512 * KIB, (12.5, 20.2, 22.1)), (1 * MIB, (19.9, 31.1, 33.8)))
      for tp, t in zip((2, 4, 8), ts)]),
]
FITTED = 3  # the first tables are what links.yaml was fitted to


def ring_link(name: str):
    """`name`'s link without its all-reduce fits or mesh: the ring model."""
    return dataclasses.replace(get_link(name), allreduce_call_s=None, allreduce_efficiency=None,
                               mesh_links=None, large_allreduce_call_s=None)


def main() -> None:
    eff = CostParams().comm_efficiency
    for label, name, source, rows in TABLES:
        link, ring = get_link(name), ring_link(name)
        print(f"{label}\n  link {name}; source: {source}")
        print(f"  {'tp':>3s} {'bytes':>9s} {'measured us':>12s} {'kvpd us':>8s} {'kvpd/meas':>10s}"
              f" {'ring us':>8s} {'ring/meas':>10s}")
        for tp, nbytes, us in rows:
            got = allreduce_seconds(link, tp, nbytes, eff) * 1e6
            old = allreduce_seconds(ring, tp, nbytes, eff) * 1e6
            print(f"  {tp:3d} {int(nbytes):9d} {us:12.1f} {got:8.1f} {got / us:10.2f} {old:8.1f}"
                  f" {old / us:10.2f}")


if __name__ == "__main__":
    main()
