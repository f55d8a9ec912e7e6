"""Pick the torch device the real executor runs on: cuda, then mps, then cpu."""

from __future__ import annotations

import torch

SUPPORTED_DEVICE_TYPES = ("cuda", "mps", "cpu")


def available_devices() -> list[str]:
    """Device types usable on this machine, in order of preference."""
    out = []
    if torch.cuda.is_available():
        out.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    out.append("cpu")
    return out


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The device to run on: `None`/"auto" picks the first of cuda, mps, cpu that exists.

    An explicit device that is absent (e.g. "cuda" on a CPU-only machine) raises ValueError
    naming what is available.
    """
    if device is None or (isinstance(device, str) and device.strip().lower() in ("", "auto")):
        return torch.device(available_devices()[0])
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device {device!r} is not a torch device; expected one of "
            f"{', '.join(SUPPORTED_DEVICE_TYPES)} or 'auto'"
        ) from exc
    avail = available_devices()
    if dev.type not in SUPPORTED_DEVICE_TYPES:
        raise ValueError(
            f"device type {dev.type!r} is not supported; supported: {', '.join(SUPPORTED_DEVICE_TYPES)}"
        )
    if dev.type not in avail:
        raise ValueError(
            f"device {str(device)!r} was asked for but is not available on this machine; "
            f"available: {', '.join(avail)}"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"device {str(device)!r} does not exist: this machine has "
            f"{torch.cuda.device_count()} CUDA device(s)"
        )
    return dev


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on `device` so wall-clock timings are real."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
