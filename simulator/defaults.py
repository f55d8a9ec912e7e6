"""What a scenario runs when it names no model or hardware (read by the scenario loader and by
the engine presets, which fill keys before the loader validates)."""

from __future__ import annotations

DEFAULT_MODEL = "llama-3-8b"  # catalog name
DEFAULT_HARDWARE = "h100-sxm"  # catalog name
