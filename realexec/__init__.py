"""Real PyTorch executor driven by the shared core scheduler (see simulator.core).

`LLM` loads the model and the core lazily importable: `from realexec import LLM, SamplingParams`.
"""

from __future__ import annotations

from typing import Any

from simulator.core.request import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    # torch is imported only when LLM is first used, so `import realexec` stays light.
    if name == "LLM":
        from realexec.engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'realexec' has no attribute {name!r}")
