"""kvpd: an LLM-serving simulator and a real PyTorch executor sharing one scheduler."""

__version__ = "0.1.0"
