"""Cost-model throughput: step-time evaluations per second for a typical mixed batch
(64 decodes + one 512-token prefill chunk), and decode_run_times steps per second.

Target (issue 4): > 100,000 step_time evaluations per second, so that a 100k-request
simulation is not bound by the cost model.

    python bench/costmodel.py [--n 200000]
"""

from __future__ import annotations

import argparse
import random
import time

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel

TARGET_EVALS_PER_S = 100_000
CONFIGS = [  # (label, model, hardware, tp, pp[, ep])
    ("llama-3-8b  h100 tp1", "llama-3-8b", "h100-sxm", 1, 1),
    ("llama-3-70b h100 tp4", "llama-3-70b", "h100-sxm", 4, 1),
    ("mixtral     h100 tp2", "mixtral-8x7b", "h100-sxm", 2, 1),
    ("llama-3-70b h100 tp4 pp2", "llama-3-70b", "h100-sxm", 4, 2),
    # MoE with expert parallelism, shared experts, dense first layers and MLA (issue 34)
    ("mixtral     h100 tp2 ep2", "mixtral-8x7b", "h100-sxm", 2, 1, 2),
    ("qwen3-30b-a3b h100 tp1", "qwen3-30b-a3b", "h100-sxm", 1, 1),
    ("deepseek-v3 h200 tp8 ep8", "deepseek-v3", "h200-sxm", 8, 1, 8),
    # every layer slides (4096 tokens): attention capped at the window (issue 34)
    ("mistral-7b  h100 tp1 window", "mistral-7b", "h100-sxm", 1, 1),
    # three of four layers Gated DeltaNet linear attention: the linear_attn operator
    ("qwen3.5-35b h100 tp1 linear", "qwen3.5-35b-a3b", "h100-sxm", 1, 1),
    # Mamba-2 blocks, MLP-free layers and LatentMoE experts (Nemotron-3 Super)
    ("nemotron-3-super b200 tp2", "nemotron-3-super-120b-a12b", "b200", 2, 1),
]


def mixed_batch(rng: random.Random, window: int = 0) -> BatchShape:
    """64 decodes at contexts 256..4096 plus one 512-token chunk after 1024 cached tokens
    (`window`: the sliding window the shape sums are capped at, 0 = none)."""
    shape = BatchShape(window=window)
    for _ in range(64):
        shape.add(1, rng.randint(256, 4096))
    shape.add(512, 1024)
    return shape


def rate(fn, n: int, repeats: int = 3) -> float:
    """Best-of-`repeats` calls per second of `fn()` over `n` calls."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    return n / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="evaluations per timing")
    args = ap.parse_args()
    rng = random.Random(0)
    shape = mixed_batch(rng)
    decode_ctx = [rng.randint(256, 4096) for _ in range(64)]
    decode_shape = BatchShape.from_lists([1] * 64, decode_ctx)
    print(f"batch: {shape.num_decode_reqs} decodes + {shape.num_prefill_reqs} x "
          f"{shape.num_prefill_tokens}-token chunk ({shape.num_tokens} tokens)")
    print(f"{'config':26s} {'step_time/s':>12s} {'vs target':>9s} {'explain/s':>10s} "
          f"{'decode_run steps/s':>19s} {'step ms':>8s}")
    worst = float("inf")
    for label, model, hw, tp, pp, *ep in CONFIGS:
        cm = CostModel(model, hw, dtype="fp8" if model == "deepseek-v3" else "bf16", tp=tp, pp=pp,
                       ep=ep[0] if ep else 1)
        w = cm.model.attention_window
        sh = mixed_batch(random.Random(0), w) if w else shape
        dsh = BatchShape.from_lists([1] * 64, decode_ctx, w) if w else decode_shape
        evals = rate(lambda cm=cm, sh=sh: cm.step_time(sh), args.n)
        explains = rate(lambda cm=cm, sh=sh: cm.explain(sh), max(1000, args.n // 50))
        runs = rate(lambda cm=cm, dsh=dsh: cm.decode_run_times(dsh, 1000), 200)
        if pp == 1:
            worst = min(worst, evals)
        print(f"{label:26s} {evals:12,.0f} {evals / TARGET_EVALS_PER_S:8.1f}x {explains:10,.0f} "
              f"{runs * 1000:19,.0f} {cm.step_time(sh) * 1e3:8.2f}")
    ctxs = [rng.randint(256, 4096) for _ in range(64)] + [1024]
    news = [1] * 64 + [512]
    build = rate(lambda: BatchShape.from_lists(news, ctxs), max(1000, args.n // 10))
    print(f"(for scale: building that BatchShape from lists, 65 add() calls: {build:,.0f}/s)")
    verdict = "PASS" if worst > TARGET_EVALS_PER_S else "FAIL"
    print(f"target: > {TARGET_EVALS_PER_S:,} step_time evaluations/s (pp=1 configs): "
          f"worst {worst:,.0f}/s -> {verdict}")


if __name__ == "__main__":
    main()
