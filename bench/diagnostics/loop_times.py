"""Serving-loop host time in real step logs: python bench/diagnostics/loop_times.py RUN_DIR_OR_LOGS...

For each worker step log (`*.steps.jsonl`, realexec/serving/step_log.py) under the given folders or
files: the median loop time ("l", ms) before a step that follows a step without KV hand-offs,
and, for a PD prefill worker, before a step that follows one which handed off h prompts, by
h, and, for a PD decode worker, before a step whose loop wrote k landed prompts' KV into the
pool ("k", since this field was logged), by k ("tokens": their median tokens). Where the log has it (since commit f1cdee5), the engine thread's CPU time in the same
interval ("lc") is shown beside it: the rest is time spent waiting for a core or a lock.
"straight on": the median over steps that followed the previous one without a wait (gap
within 0.2 ms of "l"); logs written before commit 81e2587 count idle iterations in "l" after
a wait, which these exclude.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _logs(args: list[str]) -> list[Path]:
    out: list[Path] = []
    for a in args:
        p = Path(a)
        out.extend(sorted(p.rglob("*.steps.jsonl")) if p.is_dir() else [p])
    return out


STRAIGHT_ON_S = 0.2e-3


def _straight_on(a: dict, b: dict) -> bool:
    return b["t"] - (a["t"] + a["s"]) - b["l"] < STRAIGHT_ON_S


def _row(label: str, pairs: list[tuple[dict, dict]], landed: bool = False) -> str:
    loop = [b["l"] * 1e3 for _, b in pairs]
    straight = [b["l"] * 1e3 for a, b in pairs if _straight_on(a, b)]
    cpu = [b["lc"] * 1e3 for _, b in pairs if "lc" in b]
    tok = [b.get("kt", 0) if landed else a.get("ht", 0) for a, b in pairs]
    text = f"  {label:<28} {len(loop):>6} {statistics.median(loop):>8.3f}"
    text += f" {statistics.median(cpu):>8.3f}" if cpu else f" {'-':>8}"
    text += f" {statistics.median(tok):>8.0f}"
    if straight:
        text += f" {len(straight):>8} {statistics.median(straight):>8.3f}"
    return text


def summarize(path: Path) -> str:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    pairs = [(a, b) for a, b in zip(lines, lines[1:]) if "l" in b]
    plain = [(a, b) for a, b in pairs if not a.get("h") and not b.get("k")]
    out = [f"{path}", f"  {'loop before a step after':<28} {'steps':>6} {'wall ms':>8} "
           f"{'cpu ms':>8} {'tokens':>8} {'straight on: steps':>18} {'wall ms':>8}"]
    if plain:
        out.append(_row("a step without hand-offs", plain))
    for h in sorted({a["h"] for a, _ in pairs if a.get("h")}):
        out.append(_row(f"{h} hand-off(s)", [(a, b) for a, b in pairs if a.get("h") == h]))
    for k in sorted({b["k"] for _, b in pairs if b.get("k")}):
        out.append(_row(f"{k} landing(s) before it", [(a, b) for a, b in pairs
                                                      if b.get("k") == k and not a.get("h")], True))
    return "\n".join(out)


def main() -> None:
    logs = _logs(sys.argv[1:])
    if not logs:
        sys.exit(f"no step logs under {sys.argv[1:]}")
    print("\n".join(summarize(p) for p in logs))


if __name__ == "__main__":
    main()
