"""The schema of a profile's JSON facts (`NAME.json` beside `NAME.csv`), as far as
`kvpd calibrate` reads them: the sections a fit takes numbers from are checked when the
profile is read, so a damaged or hand-edited file is refused naming the key path, value
and what is allowed, before any fit runs. Keys kvpd does not read pass through."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simulator.core.batch_shape import BatchShape
from simulator.validation_errors import format_validation_error

SHAPE_KEYS = tuple(f.name for f in dataclasses.fields(BatchShape))
PROBE_ROLES = ("colocated", "prefill", "decode")  # the engines a serving probe times
LOOP_ROW_LENGTHS = (3, 5)  # [loop_s, handoffs, handoff_tokens(, landings, landing_tokens)]


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


class ServingProbe(_Section):
    """Steps a real engine ran while serving: per role, rows [t_start (s), duration_s (s),
    *shape in `shape_fields` order]; the loop's host time before each step (`loop`); and the
    modes that failed (`errors`, mode: why)."""

    shape_fields: list[str] | None = None
    steps: dict[str, list[list[float]]] = {}
    loop: dict[str, list[list[float]]] = {}
    errors: dict[str, str] = {}

    @field_validator("shape_fields")
    @classmethod
    def _known_fields(cls, v: list[str] | None) -> list[str] | None:
        unknown = sorted(set(v or ()) - set(SHAPE_KEYS))
        if unknown:
            raise ValueError(f"unknown step-shape field(s) {unknown}; allowed: {list(SHAPE_KEYS)}")
        return v

    @field_validator("steps", "loop")
    @classmethod
    def _known_roles(cls, v: dict[str, list[list[float]]]) -> dict[str, list[list[float]]]:
        unknown = sorted(set(v) - set(PROBE_ROLES))
        if unknown:
            raise ValueError(f"unknown role(s) {unknown}; allowed: {list(PROBE_ROLES)}")
        return v

    @model_validator(mode="after")
    def _row_lengths(self) -> ServingProbe:
        if self.steps and self.shape_fields is None:
            raise ValueError("shape_fields is missing: it names the columns of the steps' rows")
        width = 2 + len(self.shape_fields or ())
        for role, rows in self.steps.items():
            for i, row in enumerate(rows):
                if len(row) != width:
                    raise ValueError(f"steps.{role}.{i}: a step is [t_start, duration_s, "
                                     f"{', '.join(self.shape_fields or ())}] ({width} numbers), "
                                     f"got {len(row)}")
                if row[1] < 0 or any(n < 0 or n != int(n) for n in row[2:]):
                    raise ValueError(f"steps.{role}.{i}: the duration and the shape's counts "
                                     f"must be >= 0 (counts whole), got {row}")
        for role, rows in self.loop.items():
            for i, row in enumerate(rows):
                if len(row) not in LOOP_ROW_LENGTHS:
                    raise ValueError(f"loop.{role}.{i}: a loop row is [loop_s, handoffs, "
                                     "handoff_tokens, landings, landing_tokens] (3 or 5 "
                                     f"numbers), got {len(row)}")
        return self


class ProfileMeta(_Section):
    device: str
    model: str
    model_config_: dict[str, Any] = Field(alias="model_config")
    dtype: str
    device_facts: DeviceFacts
    fresh_shapes: FreshShapes | None = None
    serving_probe: ServingProbe | None = None


def check_profile_meta(meta: Any, path: Path) -> None:
    """ValueError naming `path`, each bad key path, its value and what is allowed."""
    try:
        ProfileMeta.model_validate(meta)
    except ValidationError as exc:
        header = f"{path}: not a profile's facts as `kvpd profile` writes them"
        raise ValueError(format_validation_error(exc, header, ProfileMeta)) from None
