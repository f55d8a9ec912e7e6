"""`kvpd serve` under EleutherAI's lm-evaluation-harness, checked against `transformers`.

Starts `kvpd serve` on a tiny seeded model with a word-level tokenizer, runs lm-eval's
`local-completions` model over two local tasks (a multiple-choice one: batched prompts with
`echo` and `logprobs`, as every loglikelihood task sends them; a generate-until one: batched
prompts with stop strings), then recomputes each loglikelihood and its greedy flag from the
HF model's own forward pass and prints the largest difference.

    python -m venv --system-site-packages /tmp/lmvenv && /tmp/lmvenv/bin/pip install "lm_eval[api]"
    python bench/diagnostics/lm_eval_check.py --lm-eval /tmp/lmvenv/bin/lm_eval

Checked (2026-12-04, lm_eval 0.4.13, batch size 4): 36 continuations, max |loglikelihood
error| 1.2e-5, every greedy flag equal; the generate-until task completes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from realexec.engine.model_loader import load_model  # noqa: E402
from tests.serving_helpers import save_tiny_tokenizer  # noqa: E402

MODEL = "tiny-llama"
TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
"""
MC = """output_type: multiple_choice
doc_to_text: "{{ctx}}"
doc_to_choice: "{{choices}}"
doc_to_target: label
target_delimiter: " "
metric_list:
  - metric: acc
"""
GEN = """output_type: generate_until
doc_to_text: "{{ctx}}"
doc_to_target: "{{choices[0]}}"
generation_kwargs:
  until: ["t7"]
  max_gen_toks: 6
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def write_tasks(root: Path, docs: int, seed: int) -> None:
    rng = random.Random(seed)

    def words(lo: int, hi: int) -> str:
        return " ".join(f"t{rng.randrange(3, 256)}" for _ in range(rng.randrange(lo, hi)))

    with open(root / "data.jsonl", "w") as f:
        for _ in range(docs):
            f.write(json.dumps({"ctx": words(4, 12), "choices": [words(1, 4) for _ in range(3)],
                                "label": rng.randrange(3)}) + "\n")
    for name, body in (("kvpd_mc", MC), ("kvpd_gen", GEN)):
        (root / f"{name}.yaml").write_text(TASK.format(name=name, data=root / "data.jsonl") + body)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_loglikelihoods(samples: str, tokenizer_dir: Path) -> tuple[int, float]:
    """(continuations, largest |loglikelihood - HF's|); asserts every greedy flag."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
    model = load_model(MODEL, dtype="fp32", device="cpu", seed=0).model
    n, worst = 0, 0.0
    for line in Path(samples).read_text().splitlines():
        s = json.loads(line)
        for key, resp in zip(sorted(s["arguments"]), s["resps"]):
            ctx = tok.encode(s["arguments"][key]["arg_0"], add_special_tokens=False)
            cont = tok.encode(s["arguments"][key]["arg_1"], add_special_tokens=False)
            with torch.no_grad():
                lp = model(torch.tensor([ctx + cont])).logits[0].float().log_softmax(-1)
            rows = [lp[len(ctx) + i - 1] for i in range(len(cont))]
            ll = sum(float(r[t]) for r, t in zip(rows, cont))
            greedy = all(int(r.argmax()) == t for r, t in zip(rows, cont))
            got, flag = resp[0]
            assert (str(flag) == "True") == greedy, (key, resp, greedy)
            n, worst = n + 1, max(worst, abs(float(got) - ll))
    return n, worst


def _serve(port: int, root: Path, log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kvpd.cli", "serve", "--model", MODEL, "--port", str(port),
         "--tokenizer", str(root / "tok"), "--served-model-name", "tiny", "--num-threads", "1",
         "--max-model-len", "256", "--no-access-log"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lm-eval", default="lm_eval", help="the lm_eval command to run")
    ap.add_argument("--docs", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kvpd-lm-eval-"))
    save_tiny_tokenizer(str(root / "tok"))
    write_tasks(root, args.docs, seed=0)
    port = free_port()
    with open(root / "serve.log", "w") as log:
        server = _serve(port, root, log)
    try:
        deadline = time.time() + 180
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.time() > deadline:
                sys.exit(f"kvpd serve did not come up: see {root / 'serve.log'}")
            time.sleep(0.5)
        model_args = (f"model=tiny,base_url=http://127.0.0.1:{port}/v1/completions,"
                      f"tokenizer={root / 'tok'},tokenizer_backend=huggingface,max_length=256")
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        run = subprocess.run(
            [args.lm_eval, "--model", "local-completions", "--model_args", model_args,
             "--batch_size", str(args.batch_size), "--tasks", "kvpd_mc,kvpd_gen",
             "--include_path", str(root), "--log_samples", "--output_path", str(root / "out")],
            env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"lm_eval failed:\n{run.stderr[-3000:]}")
        print("\n".join(line for line in run.stdout.splitlines() if line.startswith("|")))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
    samples = glob.glob(str(root / "out" / "*" / "samples_kvpd_mc_*.jsonl"))[0]
    n, worst = check_loglikelihoods(samples, root / "tok")
    print(f"{n} continuations scored by lm-eval through kvpd serve: max |loglikelihood - "
          f"transformers'| = {worst:.2e}, every greedy flag equal")


if __name__ == "__main__":
    main()
