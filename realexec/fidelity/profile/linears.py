"""Time the executor's own linear layers at every row count (`kvpd profile` kinds `linear`
and `lm_head`).

GEMM kernels are not smooth in their row count while a roofline is linear in rows: with
fp32 MKL on one core, real llama-50m decode batches of 5, 7, 9 and 11 requests ran 7-10%
slower than the roofline fitted at 4, 8, 12 and 16 (bench/diagnostics/step_errors_by_size.py). The step grid fits the cost model at the batch sizes it
profiles; these timings give `kvpd calibrate` the shape of the curve between them
(`CostParams.linear_token_factors`, `lm_head_row_factors`, simulator/calibrate/linears.py).

- `linear` (rows = tokens): every layer's mixer projections (attention, MLA, Gated DeltaNet,
  Mamba-2; each on rows of its own input width) and its MLP or MoE block, as
  `PagedCausalLM.forward` calls them;
- `lm_head` (rows = requests): `PagedCausalLM.compute_logits` (final norm, LM head, fp32
  logits; the CPU executor's padding of 2-3 rows included).

Points are visited in seeded random order each round (`warmup` untimed rounds first).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from realexec.engine.device import synchronize
from realexec.engine.paged_model import PagedCausalLM
from simulator.calibrate.profile_io import ProfileRow
from simulator.core.batch_shape import BatchShape


def _mixer(model: PagedCausalLM, layer: nn.Module, i: int) -> nn.Module | None:
    """Layer `i`'s token mixer (softmax attention, MLA, Gated DeltaNet or Mamba-2), whose
    linears the profile runs; None for Nemotron-H's MLP and MoE blocks, which have none."""
    if model.family == "nemotron_h":
        return layer.mixer if (model.kv_layers[i] or model.linear[i]) else None
    if model.linear[i]:
        return getattr(layer, model.linear_attr)
    # (GPT-2's `attn`, GPT-NeoX's `attention`)
    return getattr(layer, "self_attn", None) or getattr(layer, "attn", None) or layer.attention


def _projections(mixer: nn.Module | None) -> list[tuple[nn.Module, int]]:
    """(projection, input width) of each `nn.Linear` in `mixer` (and GPT-2's `Conv1D`, whose
    weight is [in, out])."""
    if mixer is None:
        return []
    return [(m, m.in_features if isinstance(m, nn.Linear) else m.nx) for m in mixer.modules()
            if isinstance(m, (nn.Linear, Conv1D))]


def _mlp(model: PagedCausalLM, layer: nn.Module, i: int) -> Callable[[torch.Tensor], Any]:
    """Layer `i`'s MLP or MoE block on flat rows, as the forward calls it."""
    if model.family == "nemotron_h":
        return (lambda x: None) if (model.kv_layers[i] or model.linear[i]) else layer.mixer
    if model.family == "opt":
        return lambda x: layer.fc2(layer.activation_fn(layer.fc1(x)))
    if model.family == "llama4_text":  # (its MoE layers return (hidden, router logits))
        return layer.feed_forward
    return lambda x: model._mlp(layer, x)


def layer_linears(model: PagedCausalLM) -> Callable[[int], None]:
    """A function running every layer's linears, in order, as the forward does, on `rows`
    random rows: each projection of the layer's mixer (`nn.Linear`s of the attention, MLA,
    Gated DeltaNet or Mamba-2 module, each on rows of its own input width) and its MLP or MoE
    block. All layers, not one: one layer's weights can stay in a CPU's last-level cache
    between calls (11.5 MB for llama-50m against 32 MB of L3 here) while a step streams all
    of them from memory, and the two regimes have different size curves."""
    dev, dtype = model.device, model.dtype
    hidden = model.config.hidden_size
    inputs: dict[tuple[int, int], torch.Tensor] = {}

    def rand(rows: int, width: int) -> torch.Tensor:
        if (rows, width) not in inputs:
            inputs[rows, width] = torch.randn(rows, width, device=dev, dtype=dtype)
        return inputs[rows, width]

    plan = [(_projections(_mixer(model, layer, i)), _mlp(model, layer, i))
            for i, layer in enumerate(model.layers)]

    def run(rows: int) -> None:
        x = rand(rows, hidden)
        for projections, mlp in plan:
            for proj, width in projections:
                proj(rand(rows, width))
            mlp(x)

    return run


def lm_head(model: PagedCausalLM) -> Callable[[int], None]:
    """A function computing the logits of `rows` random hidden rows (`compute_logits`; they
    have the layers' width, which OPT-350m's final projection maps down to its LM head's)."""
    hidden = model.config.hidden_size
    inputs: dict[int, torch.Tensor] = {}

    def run(rows: int) -> None:
        if rows not in inputs:
            inputs[rows] = torch.randn(rows, hidden, device=model.device, dtype=model.dtype)
        model.compute_logits(inputs[rows])

    return run


@torch.inference_mode()
def time_linears(model: PagedCausalLM, tokens: Sequence[int], rows: Sequence[int],
                 warmup: int, repeats: int, rng: random.Random) -> list[ProfileRow]:
    """`linear` rows (one per token count in `tokens`) and `lm_head` rows (one per request
    count in `rows`), each with `repeats` timings (s)."""
    for n in (*tokens, *rows):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"profile grid: linear sizes must be integers >= 1, got {n!r}")
    fns = {"linear": layer_linears(model), "lm_head": lm_head(model)}
    points = [("linear", n) for n in tokens] + [("lm_head", n) for n in rows]
    out = {p: ProfileRow(p[0], BatchShape(num_reqs=p[1] if p[0] == "lm_head" else 0,
                                          num_tokens=p[1])) for p in points}
    dev = model.device
    for kind, n in points:  # make each point's inputs before any timing
        fns[kind](n)
    for rnd in range(warmup + repeats):
        rng.shuffle(points)
        for kind, n in points:
            t0 = time.perf_counter()
            fns[kind](n)
            synchronize(dev)
            dt = time.perf_counter() - t0
            if rnd >= warmup:
                out[(kind, n)].times_s.append(dt)
    return sorted(out.values(), key=lambda r: (r.kind, r.shape.num_tokens))
