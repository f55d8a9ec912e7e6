"""Decode attention with an FP8 KV cache against a 16-bit one: published kernel times beside
kvpd's (the check behind `kernels.yaml`'s `attn_decode.fp8_kv_relative`).

An FP8 cache holds half the bytes, but decode kernels convert every element before their
MMAs, so the published FP8 calls take more than half the 16-bit time. Each row prints the
measured FP8 / 16-bit time ratio, kvpd's for the same shape (the `attn_decode` operator of
`CostModel.explain`), and the ratio a half-the-bytes price would give.

    python bench/diagnostics/fp8_kv_decode.py

The tables state the batch but not always the context length or the head counts; kvpd's
ratio barely depends on them (KV bytes dominate the operator), so the shape used is printed.
"""

from __future__ import annotations

from simulator.core.batch_shape import BatchShape
from simulator.cost.costmodel import CostModel

# (label, source, hardware, model kvpd prices the shape with, batch, context tokens,
#  measured 16-bit us, measured FP8 us, priced: whether kernels.yaml's figure comes from it)
TABLES = [
    ("TensorRT-LLM XQA, H100 SXM, Llama-3.1-8B, batch 64 (context not stated)",
     "TensorRT-LLM issue #2372", "h100-sxm", "llama-3.1-8b", 64, 2048, 60.0, 40.0, True),
    ("TensorRT-LLM-gen decode, SM100, 256 sequences of up to 2,048 tokens",
     "vLLM PRs #19825 (BF16) and #23647 (FP8 query and KV)", "b200", "llama-3.1-70b",
     256, 1024, 174.0, 111.0, True),
    ("the same, 128 sequences of up to 2,048 tokens", "vLLM PRs #19825 and #23647", "b200",
     "llama-3.1-70b", 128, 1024, 100.0, 79.0, False),
    ("FlashInfer decode, H20, 128 sequences x 1,024 tokens, 128 q / 16 KV heads",
     "flashinfer issue #1753", "h20", "llama-3.1-70b", 128, 1024, 339.0, 437.0, False),
]


def attention_s(hardware: str, model: str, kv: str, batch: int, ctx: int) -> float:
    """Seconds of one decode step's `attn_decode` operator (all layers) in kvpd."""
    cm = CostModel(model, hardware, dtype="fp8", kv_cache_dtype=kv)
    shape = BatchShape.from_lists([1] * batch, [ctx] * batch)
    return next(o.time_s for o in cm.explain(shape).ops if o.name == "attn_decode")


def main() -> None:
    print(f"{'kernel':74s} {'measured':>9s} {'kvpd':>6s} {'half':>6s}")
    for label, source, hw, model, batch, ctx, t16, t8, priced in TABLES:
        kvpd = (attention_s(hw, model, "fp8", batch, ctx)
                / attention_s(hw, model, "bf16", batch, ctx))
        mark = "" if priced else "  (not fitted to)"
        print(f"{label:74s} {t8 / t16:9.2f} {kvpd:6.2f} {0.5:6.2f}{mark}")
        print(f"  source: {source}; kvpd shape: {model} on {hw}, {batch} x {ctx} tokens")


if __name__ == "__main__":
    main()
