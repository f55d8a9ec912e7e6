"""Host dispatch of engine steps that run outside CUDA graphs (eager PyTorch).

Under a CUDA graph a step's kernels replay from one launch, and the host's per-kernel work is
gone; kvpd's roofline prices steps that way. An engine that runs a step eagerly dispatches
every layer's operators from Python instead, and steps that synchronise with the host (MoE
routing, attention metadata) cannot run ahead of the GPU, so the dispatch adds to the step.
SGLang ran every prefill (extend) batch eagerly until its piecewise CUDA graphs became the
default (v0.5.10, `disable_piecewise_cuda_graph` False; before, `enable_piecewise_cuda_graph`
False), and from then on the batches with more tokens than `piecewise_cuda_graph_max_tokens`
(2048 for MLA models, the chunked prefill size otherwise; simulator/engines/presets.py).

`CostModel` adds `layer_s` per decoder layer to a step that `EagerDispatch.runs_eagerly`: one
with prompt tokens and more than `max_graph_tokens` tokens; decode-only steps run under the
decode graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

# SGLang PR #12160 (2025-10) logged the forward of a one-token DeepSeek-V3 prefill at
# 82.6 ms eager and 23.1 ms under CUDA graphs (TP0's "forward cost"): 59.5 ms of dispatch over
# its 61 decoder layers, 0.975 ms per layer. The host's CPU sets the real figure.
SGLANG_EAGER_LAYER_S = (82.6e-3 - 23.1e-3) / 61
EAGER_LAYER_SOURCE = ("SGLang PR #12160: a DeepSeek-V3 one-token prefill 82.6 ms eager, 23.1 ms "
                      "graphed, over 61 layers")


@dataclass(frozen=True)
class EagerDispatch:
    """Which steps run eagerly and what that costs.

    max_graph_tokens: a step with prompt tokens and more tokens than this runs eagerly (0:
    every such step). layer_s: host seconds per decoder layer of an eager step.
    """

    max_graph_tokens: int
    layer_s: float = SGLANG_EAGER_LAYER_S

    def __post_init__(self) -> None:
        if not isinstance(self.max_graph_tokens, int) or self.max_graph_tokens < 0:
            raise ValueError("prefill_graph_max_tokens must be an integer >= 0, got "
                             f"{self.max_graph_tokens!r}")
        if not self.layer_s >= 0:
            raise ValueError(f"eager_layer_s must be >= 0 s, got {self.layer_s!r}")

    def runs_eagerly(self, num_tokens: float, num_prefill_tokens: float) -> bool:
        """Whether a step of `num_tokens` tokens, `num_prefill_tokens` of them prompt tokens,
        runs outside the graphs."""
        return num_prefill_tokens > 0 and num_tokens > self.max_graph_tokens
