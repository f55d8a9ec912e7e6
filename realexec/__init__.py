"""Real PyTorch executor driven by the shared core scheduler (see simulator.core)."""
