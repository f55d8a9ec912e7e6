"""kvpd's batch-1 decode speed on A100 against gpt-fast's published table (pytorch-labs/gpt-fast
README at commit 0f925b5, "Benchmarks" and "Tensor Parallelism": 8 x A100-80GB power-limited to
330 W, hybrid cube mesh, batch 1, a 5-token prompt, BF16 weights, TP with
ENABLE_INTRA_NODE_COMM=1; the default 200 new tokens, so about 105 tokens of context on
average). The Llama-3.1 rows come from a later revision of the same table (read in a copy of the
README; the upstream revision stored here stops at Llama-2). The README's first revision
(d2c5d82, 2023-12) tabled TP before the intra-node all-reduce, 7B at TP8 179 tok/s against 328
later: those rows measure NCCL's small-message cost and are not compared.

gpt-fast is a compiled PyTorch decoder (torch.compile, CUDA graphs): each step is the weights
streamed once plus the layers' small kernels, which is what `kernels.yaml`'s
`ampere.weight_stream_efficiency` and `layer_floor` price. The README notes the power limit
holds the peak bandwidth to about 1,700 GB/s, so a full-power A100 may run a few percent faster
than these rows. gpt-fast's `tp.py` shards the attention and MLP weights only: every GPU still
reads the whole output projection (vocab x hidden) each step, which kvpd's TP splits, so kvpd's
step here adds the (1 - 1/tp) share it does not read (0.5-0.9 GB per step at TP2-8 for the
128k-vocabulary Llama-3.1 models).

Llama-2-7B at TP1 is the row `weight_stream_efficiency` 0.75 was derived from (with mlc-llm's
A10G cuBLAS profile); the other rows are a check.

    python bench/diagnostics/ampere_decode.py
"""

from __future__ import annotations

from functools import cache

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel

PART = "a100-80gb-sxm"
CONTEXT = 105  # tokens before the decoded one, averaged over gpt-fast's 5 + 200
# (model, tp, published tokens/s)
ROWS = [
    ("llama-2-7b", 1, 104.9), ("llama-2-7b", 2, 168.84), ("llama-2-7b", 4, 254.02),
    ("llama-2-7b", 8, 328.43), ("llama-2-70b", 2, 21.32), ("llama-2-70b", 4, 38.01),
    ("llama-2-70b", 8, 62.50), ("llama-3.1-8b", 1, 93.89), ("llama-3.1-8b", 2, 149.10),
    ("llama-3.1-8b", 4, 217.21), ("llama-3.1-8b", 8, 276.01), ("llama-3.1-70b", 2, 16.03),
    ("llama-3.1-70b", 4, 37.45), ("llama-3.1-70b", 8, 58.78),
]
FITTED = ("llama-2-7b", 1)


def one_decode() -> BatchShape:
    """The step gpt-fast runs: one decode after `CONTEXT` tokens."""
    shape = BatchShape()
    shape.add(1, CONTEXT)
    return shape


@cache
def cost_model(model: str, tp: int) -> CostModel:
    """kvpd's model of `model` on `tp` of the part, built once per layout."""
    return CostModel(model, PART, dtype="bf16", tp=tp)


def lm_head_s(model: str, tp: int) -> float:
    """Seconds of kvpd's `lm_head` operator (its 1/tp slice) in gpt-fast's step."""
    ops = cost_model(model, tp).explain(one_decode()).ops
    return next(op.time_s for op in ops if op.name == "lm_head")


def unsharded_lm_head_s(model: str, tp: int) -> float:
    """Seconds of output projection gpt-fast reads beyond kvpd's TP-sharded one: kvpd's own
    `lm_head` operator whole (tp 1) less its 1/tp slice."""
    return lm_head_s(model, 1) - lm_head_s(model, tp) if tp > 1 else 0.0


def predicted_tok_s(model: str, tp: int) -> float:
    """kvpd's batch-1 decode tokens/s for gpt-fast's layout of `model` at `tp`."""
    return 1.0 / (cost_model(model, tp).step_time(one_decode()) + unsharded_lm_head_s(model, tp))


def main() -> None:
    print(f"batch-1 decode on {PART}, bf16: kvpd against gpt-fast's README")
    print(f"  {'model':14s} {'tp':>3s} {'published tok/s':>16s} {'kvpd tok/s':>11s} {'error':>7s}")
    errors = []
    for model, tp, published in ROWS:
        got = predicted_tok_s(model, tp)
        err = got / published - 1
        fitted = (model, tp) == FITTED
        if not fitted:
            errors.append(abs(err))
        print(f"  {model:14s} {tp:3d} {published:16.2f} {got:11.2f} {err:+7.1%}"
              + ("  (derived from)" if fitted else ""))
    errors.sort()
    print(f"  the {len(errors)} rows not derived from: median |error| "
          f"{errors[len(errors) // 2]:.1%}, worst {errors[-1]:.1%}")


if __name__ == "__main__":
    main()
