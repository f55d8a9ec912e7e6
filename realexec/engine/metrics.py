"""Run metrics of the real engine, through the simulator's shared `simulator.metrics`, so
real and simulated runs write the same `summary.json` and per-request records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.core.request import Request
from simulator.metrics import SLO, request_records, summarize, write_records, write_summary

if TYPE_CHECKING:
    from realexec.engine.llm import LLM
    from realexec.engine.outputs import RequestOutput


def requests_of(outputs: list[RequestOutput]) -> list[Request]:
    """The core `Request`s behind `generate` outputs (children of n > 1 included)."""
    return [r for o in outputs for r in o.requests]


def summarize_run(llm: LLM, requests: list[Request], wall_s: float,
                  slo: SLO | None = None, extra: dict | None = None) -> dict:
    """The `summary.json` dict of `requests` served by `llm` in `wall_s` seconds."""
    stats = llm.kv_cache_manager.get_stats()
    extra = dict(extra or {})
    extra.setdefault("backend", {
        "kind": "real",
        "model": llm.loaded.source,
        "device": str(llm.device),
        "dtype": str(llm.loaded.dtype).removeprefix("torch."),
        "num_gpu_blocks": stats.num_gpu_blocks,
        "block_size": llm.kv_cache_manager.block_size,
    })
    return summarize(requests, slo=slo, kv_peak_usage=stats.peak_usage,
                     prefix_hit_rate=stats.prefix_hit_rate, wall_s=wall_s, extra=extra)


def write_run(out_dir: str | Path, llm: LLM, outputs: list[RequestOutput], wall_s: float,
              slo: SLO | None = None) -> dict:
    """Write `summary.json`, `requests.parquet` and `outputs.json` (token ids, and text with
    a tokenizer) to `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reqs = requests_of(outputs)
    summary = summarize_run(llm, reqs, wall_s, slo)
    write_summary(summary, out / "summary.json")
    write_records(request_records(reqs), out / "requests.parquet")
    rows = [{"request_id": o.request_id, "prompt_token_ids": o.prompt_token_ids,
             **({"prompt": o.prompt} if o.prompt is not None else {}),
             "outputs": [{"index": c.index, "token_ids": c.token_ids,
                          **({"text": c.text} if c.text is not None else {}),
                          "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                          "token_times_s": c.token_times} for c in o.outputs]}
            for o in outputs]
    (out / "outputs.json").write_text(json.dumps(rows, indent=1) + "\n")
    return summary
