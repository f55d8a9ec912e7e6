"""Greedy output of the paged engine against `transformers`' own `generate`, on any device.

The test suite checks this on the CPU (tests/test_realexec_correctness.py); this runs the same
comparison on the device you name (cuda, mps, cpu), for every supported family's tiny seeded
model, in fp32 and optionally a 16-bit dtype, over one batch of mixed prompt lengths with a
small token budget (so chunked prefill and mixed steps happen). It prints, per model and dtype,
how many requests matched token for token and the first divergence of each that did not.

On a GPU, batched kernels (a decode batch of 13) and the reference's one-request kernels may
round differently, so a 16-bit run can diverge after a near-tie of two logits; fp32 divergence
is the one to chase.

    python bench/greedy_check.py --device cuda --dtypes fp32,bf16 [--json OUT.json]

Exit status 1 when an fp32 request diverges, else 0.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from realexec import LLM, SamplingParams
from realexec.engine.configs import BUILTIN_CONFIGS
from realexec.engine.hf_reference import hf_greedy
from realexec.engine.model_loader import load_model

# every family's tiny seeded model (dense, sliding window, MoE, MLA, gpt-oss)
FAMILIES = tuple(name for name in BUILTIN_CONFIGS if name.startswith("tiny-"))
LENGTHS = (1, 2, 3, 5, 8, 13, 16, 17, 31, 32, 47, 64, 90)


def check(name: str, dtype: str, device: str, seed: int) -> dict:
    rng = random.Random(seed)
    llm = LLM(name, dtype=dtype, device=device, num_gpu_blocks=256, block_size=4,
              max_num_batched_tokens=32, model_seed=0)
    vocab = llm.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in LENGTHS]
    params = [SamplingParams(temperature=0.0, max_tokens=1 + (7 * i) % 24)
              for i in range(len(prompts))]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    engine_s = time.perf_counter() - t0
    ref_model = load_model(name, dtype=dtype, device=device, seed=0).model
    diverged = []
    for i, (p, sp, o) in enumerate(zip(prompts, params, outs)):
        ref = hf_greedy(ref_model, p, sp.max_tokens)
        if o.token_ids != ref:
            at = next((k for k, (a, b) in enumerate(zip(o.token_ids, ref)) if a != b),
                      min(len(o.token_ids), len(ref)))
            diverged.append({"request": i, "prompt_tokens": len(p), "first_diff_at": at,
                             "engine": o.token_ids[at:at + 3], "hf": ref[at:at + 3]})
    return {"model": name, "dtype": dtype, "device": str(llm.device), "requests": len(prompts),
            "matched": len(prompts) - len(diverged), "diverged": diverged,
            "engine_s": round(engine_s, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtypes", default="fp32", help="comma-separated: fp32, bf16, fp16")
    ap.add_argument("--models", default=",".join(FAMILIES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    results = []
    for dtype in dict.fromkeys(args.dtypes.split(",")):  # each dtype once, in order
        for name in args.models.split(","):
            r = check(name, dtype, args.device, args.seed)
            results.append(r)
            print(f"{r['model']:<13} {r['dtype']:<5} {r['device']:<7} matched "
                  f"{r['matched']}/{r['requests']}"
                  + "".join(f"\n    request {d['request']} ({d['prompt_tokens']} prompt tokens): "
                            f"first differs at output token {d['first_diff_at']}: engine "
                            f"{d['engine']} vs hf {d['hf']}" for d in r["diverged"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    fp32_bad = sum(len(r["diverged"]) for r in results if r["dtype"] == "fp32")
    return 1 if fp32_bad else 0


if __name__ == "__main__":
    sys.exit(main())
