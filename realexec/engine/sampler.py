"""Token sampling for a step: greedy, temperature, top-k, top-p, per-request seeds.

One row of fp32 logits per request that samples this step. Greedy when temperature is 0
(below `_GREEDY_EPS`, as vLLM). Random rows draw with the exponential race
(`argmax(p / q)`, `q ~ Exp(1)`, as vLLM's sampler): one `[vocab]` draw per sampled token from
the request's own `torch.Generator` when it has a seed, so its tokens do not depend on what
else is in the batch; unseeded rows share one generator seeded from the engine seed.
`min_tokens` hides EOS and the stop ids until that many tokens are out. In vLLM's order:
logit biases and `min_tokens`, then presence, frequency and repetition penalties
(`apply_penalties`), then greedy argmax, or temperature, min-p, top-k/top-p and the draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from simulator.core.request import penalties_on

_GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: temperatures below are greedy


@dataclass
class SamplingRow:
    """What the sampler needs of one request (the core's SamplingParams + state)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) = off
    generator: torch.Generator | None = None
    num_output_tokens: int = 0
    min_tokens: int = 0
    banned_until_min: tuple[int, ...] = ()  # EOS + stop ids while num_output < min_tokens
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    prompt_ids: Sequence[int] = ()  # the request's tokens, read only when a penalty is on
    output_ids: Sequence[int] = ()
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def penalized(self) -> bool:
        return penalties_on(self.presence_penalty, self.frequency_penalty,
                            self.repetition_penalty)


def row_from_params(params: Any, num_output_tokens: int, eos_token_id: int | None,
                    generator: torch.Generator | None, prompt_ids: Sequence[int] = (),
                    output_ids: Sequence[int] = ()) -> SamplingRow:
    """A `SamplingRow` from a core `SamplingParams`-like object and, for its penalties, the
    request's prompt and output token ids."""
    banned: tuple[int, ...] = ()
    if num_output_tokens < params.min_tokens:
        ids = list(params.stop_token_ids)
        if eos_token_id is not None and not params.ignore_eos:
            ids.append(eos_token_id)
        banned = tuple(ids)
    return SamplingRow(
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
        generator=generator, num_output_tokens=num_output_tokens,
        min_tokens=params.min_tokens, banned_until_min=banned,
        presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty, prompt_ids=prompt_ids,
        output_ids=output_ids, min_p=params.min_p, logit_bias=tuple(params.logit_bias),
    )


def _token_counts(seqs: list[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """`[len(seqs), vocab]` counts of each token id in each sequence."""
    counts = torch.zeros(len(seqs), vocab, dtype=torch.float32, device=device)
    ids = [t for seq in seqs for t in seq]
    if ids:
        rows = torch.repeat_interleave(torch.arange(len(seqs), device=device),
                                       torch.tensor([len(q) for q in seqs], device=device))
        counts.index_put_((rows, torch.tensor(ids, device=device)),
                          torch.ones(len(ids), device=device), accumulate=True)
    return counts


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """Penalize `logits` `[n, vocab]` in place, as vLLM: a repetition penalty p divides the
    positive logits (multiplies the negative ones) of every token in the prompt or output;
    then each token loses frequency x its count in the output and presence once if there."""
    pen = [r for r, row in enumerate(rows) if row.penalized]
    if not pen:
        return
    dev, vocab = logits.device, logits.shape[-1]
    sel = torch.tensor(pen, device=dev)

    def column(name: str) -> torch.Tensor:
        return torch.tensor([getattr(rows[r], name) for r in pen], device=dev).unsqueeze(1)

    x = logits.index_select(0, sel)
    out = _token_counts([rows[r].output_ids for r in pen], vocab, dev)
    seen = (_token_counts([rows[r].prompt_ids for r in pen], vocab, dev) > 0) | (out > 0)
    rep = column("repetition_penalty")
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x -= column("frequency_penalty") * out + column("presence_penalty") * (out > 0)
    logits[sel] = x


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None) -> torch.Tensor:
    """Set logits outside each row's top-k / top-p nucleus to -inf (vLLM's algorithm).

    `top_k`: `[n]` long (vocab size = off); `top_p`: `[n]` float (1.0 = off).
    """
    sorted_logits, idx = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[-1]
    if top_k is not None:
        kth = sorted_logits.gather(-1, (vocab - top_k).clamp(0, vocab - 1).unsqueeze(-1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        cum = probs.cumsum(dim=-1)
        drop = cum <= (1.0 - top_p).unsqueeze(-1)
        drop[:, -1] = False  # keep at least the most likely token
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, idx, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Set to -inf the logits whose probability is below `min_p` `[n]` x their row's largest
    (transformers' `MinPLogitsWarper`, vLLM's min-p); the most likely token always stays."""
    probs = logits.softmax(dim=-1)
    floor = min_p.unsqueeze(-1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < floor, float("-inf"))


class Sampler:
    """Samples one token per row; owns the generator of unseeded requests."""

    def __init__(self, device: torch.device, seed: int = 0) -> None:
        self.device = device
        self.global_generator = torch.Generator(device=device)
        self.global_generator.manual_seed(seed)

    def make_generator(self, seed: int) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(int(seed))
        return g

    def sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
        """Token ids, one per row of `logits` `[n, vocab]` (fp32)."""
        if len(rows) != logits.shape[0]:
            raise ValueError(f"{len(rows)} sampling rows for {logits.shape[0]} logit rows")
        if not rows:
            return []
        vocab = logits.shape[-1]
        for r, row in enumerate(rows):
            if row.logit_bias:
                ids, bias = zip(*row.logit_bias)
                logits[r, list(ids)] += torch.tensor(bias, device=logits.device)
            if row.banned_until_min:
                logits[r, list(row.banned_until_min)] = float("-inf")
        apply_penalties(logits, rows)
        out = logits.argmax(dim=-1)
        rand = [r for r, row in enumerate(rows) if not row.greedy]
        if rand:
            sel = torch.tensor(rand, device=logits.device)
            x = logits.index_select(0, sel)
            temps = torch.tensor([rows[r].temperature for r in rand], device=x.device)
            x = x / temps.unsqueeze(-1)
            mins = [rows[r].min_p for r in rand]
            if any(mins):
                x = apply_min_p(x, torch.tensor(mins, device=x.device))
            ks = [rows[r].top_k if 0 < rows[r].top_k < vocab else vocab for r in rand]
            ps = [rows[r].top_p for r in rand]
            top_k = torch.tensor(ks, device=x.device) if any(k < vocab for k in ks) else None
            top_p = torch.tensor(ps, device=x.device) if any(p < 1.0 for p in ps) else None
            if top_k is not None or top_p is not None:
                x = apply_top_k_top_p(x, top_k, top_p)
            probs = x.softmax(dim=-1)
            q = torch.empty_like(probs)
            for j, r in enumerate(rand):
                q[j].exponential_(generator=rows[r].generator or self.global_generator)
            out[sel] = probs.div(q).argmax(dim=-1)
        return out.tolist()
