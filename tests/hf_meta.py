"""A transformers model built from a config on the meta device (no memory), to count its
parameters against the simulator's."""

from __future__ import annotations

import pytest


def hf_on_meta(model_type: str, cfg: dict):
    """(transformers' config, its causal LM on the meta device) of `model_type` with `cfg`."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        return hf_cfg, transformers.AutoModelForCausalLM.from_config(hf_cfg)
