"""The six rungs of the KV-cache ladder (see `realexec.fidelity.ladder`), each timed on one workload.

Every rung decodes greedily with EOS banned until the request's `max_tokens` (vLLM's
`min_tokens`, HF's `min_new_tokens`), so all rungs emit the same number of tokens and their
token ids can be compared one to one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers.generation.streamers import BaseStreamer

from realexec.engine.device import synchronize
from realexec.engine.llm import LLM
from realexec.engine.model_loader import LoadedModel, eos_token_id
from realexec.engine.paged_model import PagedCausalLM
from realexec.engine.simple_attention import ContiguousKVAttention, NoCacheAttention
from simulator.core.request import SamplingParams


@dataclass
class Workload:
    """Prompts (token ids), output lengths (tokens) and arrival offsets (s)."""

    name: str
    prompts: list[list[int]]
    max_tokens: list[int]
    arrivals: list[float]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.max_tokens)


@dataclass
class RungResult:
    rung: int
    name: str
    workload: str
    output_tokens: int
    span_s: float  # first arrival (or start) to last token
    ttft_s: list[float]  # per request: first token - arrival (or request start)
    tokens: list[list[int]] = field(repr=False)
    decode_step_s: list[float] = field(default_factory=list, repr=False)
    decode_step_bytes: list[int] = field(default_factory=list, repr=False)  # weights + KV read

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.span_s

    @property
    def ttft_mean_s(self) -> float:
        return float(np.mean(self.ttft_s))


def _params(m: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=m, min_tokens=m)


def _greedy(logits: torch.Tensor, eos: int | None) -> int:
    if eos is not None:
        logits[..., eos] = float("-inf")
    return int(logits.argmax(dim=-1)[0])


class SingleRequestRunner:
    """Rungs 1 and 2: one request at a time, no engine, plain greedy loop."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.pm = PagedCausalLM(loaded.model)
        if self.pm.has_linear:  # its rungs keep a KV cache per request, no recurrent state
            raise ValueError(f"the ladder's rungs do not run {loaded.config.model_type}'s "
                             "linear-attention layers; the paged engine (kvpd generate, serve) "
                             "does")
        self.eos = eos_token_id(loaded.config)
        self.dev = loaded.device
        kv_per_token = 2 * self.pm.num_layers * self.pm.num_kv_heads * self.pm.head_dim
        self.kv_bytes_per_token = kv_per_token * torch.empty((), dtype=loaded.dtype).element_size()

    @torch.inference_mode()
    def no_cache(self, prompt: list[int], m: int) -> tuple[list[int], float, float]:
        """Recompute the whole sequence for every token: (tokens, ttft s, total s)."""
        t0 = time.perf_counter()
        ids = list(prompt)
        out, ttft = [], 0.0
        for _ in range(m):
            x = torch.tensor(ids, device=self.dev)
            pos = torch.arange(len(ids), device=self.dev)
            h = self.pm.forward(x, pos, NoCacheAttention())
            tok = _greedy(self.pm.compute_logits(h, pos[-1:]), self.eos)
            if not out:
                synchronize(self.dev)
                ttft = time.perf_counter() - t0
            out.append(tok)
            ids.append(tok)
        synchronize(self.dev)
        return out, ttft, time.perf_counter() - t0

    @torch.inference_mode()
    def contiguous(self, prompt: list[int], m: int, steps: list[float] | None = None,
                   step_bytes: list[int] | None = None) -> tuple[list[int], float, float]:
        """Prefill once, then decode with a contiguous per-request KV cache."""
        pm = self.pm
        t0 = time.perf_counter()
        attn = ContiguousKVAttention(pm.num_layers, pm.num_kv_heads, pm.head_dim,
                                     len(prompt) + m, self.loaded.dtype, self.dev)
        x = torch.tensor(prompt, device=self.dev)
        pos = torch.arange(len(prompt), device=self.dev)
        h = pm.forward(x, pos, attn)
        attn.advance()
        tok = _greedy(pm.compute_logits(h, pos[-1:]), self.eos)
        synchronize(self.dev)
        ttft = time.perf_counter() - t0
        out = [tok]
        for i in range(1, m):
            ts = time.perf_counter()
            n = len(prompt) + i - 1  # position of the token being fed
            h = pm.forward(torch.tensor([tok], device=self.dev), torch.tensor([n], device=self.dev), attn)
            attn.advance()
            tok = _greedy(pm.compute_logits(h), self.eos)
            out.append(tok)
            if steps is not None:
                synchronize(self.dev)
                steps.append(time.perf_counter() - ts)
                step_bytes.append(self.loaded.weight_bytes + (n + 1) * self.kv_bytes_per_token)
        synchronize(self.dev)
        return out, ttft, time.perf_counter() - t0


def rung_no_cache(runner: SingleRequestRunner, w: Workload) -> RungResult:
    toks, ttfts, total = [], [], 0.0
    for p, m in zip(w.prompts, w.max_tokens):
        t, ttft, dt = runner.no_cache(p, m)
        toks.append(t)
        ttfts.append(ttft)
        total += dt
    return RungResult(1, "no KV cache (recompute all)", w.name, w.num_output_tokens, total, ttfts, toks)


def rungs_contiguous_and_paged(runner: SingleRequestRunner, engine: LLM, w: Workload,
                               repeats: int = 1) -> tuple[RungResult, RungResult]:
    """Rungs 2 and 3, interleaved request by request so machine-load noise hits both; each
    request runs `repeats` times per rung and the fastest run counts (best of N)."""
    r2 = RungResult(2, "contiguous KV cache, 1 request", w.name, w.num_output_tokens, 0.0, [], [])
    r3 = RungResult(3, "paged KV cache, 1 request", w.name, w.num_output_tokens, 0.0, [], [])
    for p, m in zip(w.prompts, w.max_tokens):
        best2 = best3 = None
        for _ in range(repeats):
            steps: list[float] = []
            nbytes: list[int] = []
            t, ttft, dt = runner.contiguous(p, m, steps, nbytes)
            if best2 is None or dt < best2[2]:
                best2 = (t, ttft, dt, steps, nbytes)
            t0 = time.perf_counter()
            (o,) = engine.generate([p], _params(m))
            dt = time.perf_counter() - t0
            if best3 is None or dt < best3[2]:
                best3 = (o.token_ids, o.outputs[0].first_token_time - o.arrival_time, dt)
        for r, best in ((r2, best2), (r3, best3)):
            r.tokens.append(best[0])
            r.ttft_s.append(best[1])
            r.span_s += best[2]
        r2.decode_step_s += best2[3]
        r2.decode_step_bytes += best2[4]
    return r2, r3


def rung_engine(rung: int, name: str, engine: LLM, w: Workload) -> RungResult:
    """Rungs 4 and 5: the whole workload through the engine with staggered arrivals."""
    engine.runner.steps.clear()
    outs = engine.generate(w.prompts, [_params(m) for m in w.max_tokens], w.arrivals)
    start = min(o.arrival_time for o in outs)
    end = max(o.outputs[0].finish_time for o in outs)
    res = RungResult(rung, name, w.name, sum(len(o.token_ids) for o in outs), end - start,
                     [o.outputs[0].first_token_time - o.arrival_time for o in outs],
                     [o.token_ids for o in outs])
    spec_bytes = engine.kv_cache.spec.bytes_per_token
    for s in engine.runner.steps:
        if s.shape.num_prefill_reqs == 0 and s.shape.num_decode_reqs:
            res.decode_step_s.append(s.execute_s)
            res.decode_step_bytes.append(engine.loaded.weight_bytes
                                         + s.shape.decode_context_tokens * spec_bytes)
    return res


class _FirstTokenTimer(BaseStreamer):
    """Records when `generate` emits its first new tokens (the second `put`)."""

    def __init__(self) -> None:
        self.puts = 0
        self.first_token_time: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first_token_time is None:
            self.first_token_time = time.perf_counter()

    def end(self) -> None:
        pass


@torch.inference_mode()
def rung_hf_static(loaded: LoadedModel, w: Workload, max_batch: int) -> RungResult:
    """Rung 6: HF `generate` on left-padded static batches. When idle, the batch is every
    arrived request (up to `max_batch`), as the core's static batcher admits them."""
    model, dev = loaded.model, loaded.device
    n = len(w.prompts)
    order = sorted(range(n), key=lambda i: (w.arrivals[i], i))
    toks: list[list[int]] = [[] for _ in range(n)]
    ttft = [0.0] * n
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0  # noqa: E731
    k = 0
    last_end = 0.0
    while k < n:
        if w.arrivals[order[k]] > clock():
            time.sleep(w.arrivals[order[k]] - clock())
        now = clock()
        batch = []
        while k < n and len(batch) < max_batch and w.arrivals[order[k]] <= now:
            batch.append(order[k])
            k += 1
        longest = max(len(w.prompts[i]) for i in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        mask = torch.zeros(len(batch), longest, dtype=torch.long)
        for r, i in enumerate(batch):
            p = w.prompts[i]
            ids[r, longest - len(p):] = torch.tensor(p)
            mask[r, longest - len(p):] = 1
        m = max(w.max_tokens[i] for i in batch)
        timer = _FirstTokenTimer()
        out = model.generate(ids.to(dev), attention_mask=mask.to(dev), do_sample=False,
                             max_new_tokens=m, min_new_tokens=m, pad_token_id=0, streamer=timer)
        synchronize(dev)
        last_end = clock()
        for r, i in enumerate(batch):
            toks[i] = out[r, longest : longest + w.max_tokens[i]].tolist()
            ttft[i] = (timer.first_token_time - t0) - w.arrivals[i]
    span = last_end - min(w.arrivals)
    return RungResult(6, "HF generate, padded static batches", w.name,
                      sum(len(t) for t in toks), span, ttft, toks)
