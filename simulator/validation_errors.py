"""One report of a pydantic `ValidationError` for every file kvpd reads (scenarios, profiles):
a header naming the file, then a line per bad key path with its value and what is allowed."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError


def allowed_keys(model: type[BaseModel], loc: tuple, hidden: tuple[str, ...] = ()) -> list[str]:
    """The keys allowed at `loc` (a pydantic error location) in `model`, less `hidden`."""
    cur: Any = model
    for part in loc[:-1]:
        field = getattr(cur, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", None) or (ann,)
        cur = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if cur is None:
            return []
    fields = getattr(cur, "model_fields", {})
    return sorted((f.alias or k) for k, f in fields.items() if k not in hidden)


def format_validation_error(exc: ValidationError, header: str, model: type[BaseModel],
                            hidden: tuple[str, ...] = (), top: str = "(top level)") -> str:
    """`header`, then per error: the key path (`top` for the file itself), what is wrong and
    the value given; an unknown key names the closest allowed ones, then every key of `model`
    allowed there (less `hidden`)."""
    lines = [header]
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc)
        if err["type"] == "extra_forbidden":
            allowed = allowed_keys(model, loc, hidden)
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=3)
            hint = f"; did you mean {close}?" if close else ""
            lines.append(f"  {key}: unknown key{hint} (allowed: {', '.join(allowed)})")
        elif err["type"] == "missing":
            lines.append(f"  {key}: missing (a required key)")
        elif err["type"] == "value_error" and isinstance(err.get("input"), dict):
            # a check across a section's keys: its message names them; the mapping itself
            # (the whole file, for a top-level check) would only bury it
            msg = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"  {key or top}: {msg}")
        else:  # a validator's own message may name the key already: not twice
            msg = str(err["msg"]).removeprefix("Value error, ").removeprefix(f"{key}: ")
            lines.append(f"  {key}: {msg} (got {err.get('input')!r})")
    return "\n".join(lines)
