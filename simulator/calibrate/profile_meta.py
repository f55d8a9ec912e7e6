"""The schema of a profile's JSON facts (`NAME.json` beside `NAME.csv`), as far as
`kvpd calibrate` reads them: the sections a fit takes numbers from are checked when the
profile is read, so a damaged or hand-edited file is refused naming the key path, value
and what is allowed, before any fit runs. Keys kvpd does not read pass through."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from simulator.core.batch_shape import BatchShape

SHAPE_KEYS = tuple(f.name for f in dataclasses.fields(BatchShape))


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)


class ContentionPoint(_Section):
    """One step timed alone and beside a memory-streaming and a spinning neighbour (s)."""

    kind: str | None = None
    shape: dict[str, int]
    none_s: float | None = Field(default=None, ge=0)
    stream_s: float | None = Field(default=None, ge=0)
    spin_s: float | None = Field(default=None, ge=0)

    @field_validator("shape")
    @classmethod
    def _shape_keys(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(SHAPE_KEYS))
        if unknown:
            raise ValueError(f"unknown step-shape key(s) {unknown}; allowed: {list(SHAPE_KEYS)}")
        if any(n < 0 for n in v.values()):
            raise ValueError("step-shape counts must be >= 0")
        return v


class HostContention(_Section):
    points: list[ContentionPoint] = []


class IdleWake(_Section):
    """Step time (s) after each idle gap (s)."""

    gaps_s: list[float] = []
    median_s: list[float] = []


class DeviceFacts(_Section):
    cpu_available: float | None = Field(default=None, ge=0)
    host_contention: HostContention | None = None
    idle_wake: IdleWake | None = None


class FreshPoint(_Section):
    kind: str
    batch: int = Field(ge=0)
    tokens: int = Field(ge=0)
    ratio: float | None = Field(default=None, gt=0)


class FreshShapes(_Section):
    points: list[FreshPoint] = []
    ratio: float | None = Field(default=None, gt=0)


class ProfileMeta(_Section):
    device: str
    model: str
    model_config_: dict[str, Any] = Field(alias="model_config")
    dtype: str
    device_facts: DeviceFacts
    fresh_shapes: FreshShapes | None = None
    serving_probe: dict[str, Any] | None = None


def check_profile_meta(meta: Any, path: Path) -> None:
    """ValueError naming `path`, each bad key path, its value and what is allowed."""
    try:
        ProfileMeta.model_validate(meta)
    except ValidationError as exc:
        lines = [f"{path}: not a profile's facts as `kvpd profile` writes them"]
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(top level)"
            got = "" if err["type"] == "missing" else f" (got {err.get('input')!r})"
            lines.append(f"  {key}: {str(err['msg']).removeprefix('Value error, ')}{got}")
        raise ValueError("\n".join(lines)) from None
