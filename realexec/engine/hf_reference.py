"""`transformers`' own greedy `generate`: the reference the paged engine must match token for
token (tests/test_realexec_correctness.py on the CPU, bench/greedy_check.py on any device)."""

from __future__ import annotations

import torch


def hf_greedy(model, prompt: list[int], max_tokens: int, **options) -> list[int]:
    """The new token ids HF's greedy `generate` gives for one prompt on `model`'s device
    (it stops at the model's EOS, as the engine does); `options` go to `generate` (e.g.
    `repetition_penalty`)."""
    dev = model.device
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt], device=dev),
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long,
                                                       device=dev),
                             do_sample=False, max_new_tokens=max_tokens, pad_token_id=0,
                             **options)
    return out[0, len(prompt):].tolist()
