"""Are decode steps slower when a request's KV blocks are scattered over the pool? (CPU)

    python bench/diagnostics/block_order.py [--rounds 7]

A fresh pool hands blocks out in id order, so a profile's requests get contiguous KV; after
real traffic has come and gone the free queue is in no particular order and each request's
blocks lie scattered over the whole pool. This times the same decode steps (equal and
ragged contexts) over both layouts, alternating which goes first in each round, and prints
the median step of each and their ratio. `kvpd profile` scatters blocks by default
(`ProfileGrid.scatter_blocks`) because of what this measured.

2026-11-29, this 2-core VM, llama-50m fp32, 1 thread, 7 rounds: scattered / id order =
1.000-1.049 (batch 4 x 512 tokens: 1.039; 16 x 256: 1.000; 16 x 768: 1.024; 32 x 384:
1.038; ragged 16 x 768: 1.026; ragged 32 x 384: 1.020; 8 x 1536: 1.049).
"""

from __future__ import annotations

import argparse
import random
import statistics

import torch

from realexec.fidelity.profile.profiler import ProfileGrid, Profiler, scatter_free_blocks

# (kind, batch, context tokens): decode points of the default profile grid
POINTS = (("equal", 4, 512), ("equal", 16, 256), ("equal", 16, 768), ("equal", 32, 384),
          ("ragged", 16, 768), ("ragged", 32, 384), ("equal", 8, 1536))


def in_id_order(pool) -> None:
    """Free queue in id order (as a fresh pool hands blocks out)."""
    blocks = pool.get_new_blocks(pool.num_free_blocks)
    blocks.sort(key=lambda b: b.block_id)
    pool.free_blocks(blocks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--model", default="llama-50m")
    args = ap.parse_args()
    torch.set_num_threads(1)
    prof = Profiler(args.model, grid=ProfileGrid(scatter_blocks=False), seed=0)
    pool = prof.llm.kv_cache_manager.block_pool
    rng = random.Random(1)
    layouts = {"id order": in_id_order, "scattered": lambda p: scatter_free_blocks(p, rng)}
    times: dict[tuple, list[float]] = {}
    for rnd in range(args.rounds):
        for kind, batch, ctx in POINTS:
            order = list(layouts) if rnd % 2 else list(reversed(layouts))
            for name in order:
                layouts[name](pool)
                sample = (prof._group(batch, ctx, ()) if kind == "equal"
                          else prof._ragged(batch, ctx))[0]
                times.setdefault((kind, batch, ctx, name), []).append(sample[2])
    print(f"{pool.num_blocks} blocks of {prof.llm.kv_cache.block_size} tokens, "
          f"{args.rounds} rounds")
    print(f"{'decode step':22s} {'id order ms':>12s} {'scattered ms':>13s} {'ratio':>7s}")
    for kind, batch, ctx in POINTS:
        a = statistics.median(times[(kind, batch, ctx, "id order")])
        s = statistics.median(times[(kind, batch, ctx, "scattered")])
        print(f"{kind:6s} {batch:3d} x {ctx:5d} tokens {a * 1e3:12.2f} {s * 1e3:13.2f} "
              f"{s / a:7.3f}")


if __name__ == "__main__":
    main()
