"""What the incremental `Detokenizer` costs per output token, against decoding the whole
output at every step (what it did before), side by side in one run.

    python bench/diagnostics/detokenizer_cost.py [--tokens 512,2048,8192] [--stop]

A byte-level BPE tokenizer is trained offline on a small multilingual text (as the tests'),
and a greedy-looking output of N random token ids is fed one token per step, as the server and
`realexec.LLM` feed it. Prints microseconds per token for both ways and their ratio; both
ways' text must be equal (checked).
"""

from __future__ import annotations

import argparse
import random
import time

from realexec.engine.tokenizer import Detokenizer

CORPUS = ["naïve café déjà vu — 東京 tower, ünïcödé text and plain words for the tokenizer",
          "the quick brown fox jumps over the lazy dog", "héllo wörld 你好 世界 ok"] * 40


def byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def whole_each_step(tok, ids: list[int]) -> str:
    """The old way: decode everything so far at every step."""
    text = ""
    for n in range(1, len(ids) + 1):
        full = tok.decode(ids[:n], skip_special_tokens=True)
        if not full.endswith("\ufffd"):
            text = full
    return text


def incremental(tok, ids: list[int], stops: list[str]) -> str:
    det = Detokenizer(tok, stops)
    out = [det.add([t]) for t in ids[:-1]] + [det.add(ids[-1:], final=True)]
    return "".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="512,2048,8192")
    ap.add_argument("--stop", action="store_true", help="with a stop string that never matches")
    args = ap.parse_args()
    tok = byte_level_tokenizer()
    rng = random.Random(0)
    stops = ["\x00never"] if args.stop else []
    print(f"{'tokens':>7} {'whole us/tok':>13} {'window us/tok':>14} {'ratio':>7}")
    for n in (int(x) for x in args.tokens.split(",")):
        ids = [rng.randrange(len(tok)) for _ in range(n)]
        t0 = time.perf_counter()
        a = whole_each_step(tok, ids)
        t1 = time.perf_counter()
        b = incremental(tok, ids, stops)
        t2 = time.perf_counter()
        if a != b and not tok.decode(ids).endswith("\ufffd"):
            raise SystemExit(f"texts differ at {n} tokens")
        whole, window = (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6
        print(f"{n:>7} {whole:>13.1f} {window:>14.1f} {whole / window:>6.1f}x")


if __name__ == "__main__":
    main()
