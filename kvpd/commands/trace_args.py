"""Option parsing shared by the `kvpd trace` subcommands ("k=v,k=v" mappings, load options)."""

from __future__ import annotations

import argparse
from typing import Any

from kvpd.commands.arg_types import non_negative_int


def parse_scalar(text: str) -> Any:
    """'12' -> 12, '1.5' -> 1.5, 'true'/'false' -> bool, 'none' -> None, else the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text.strip()


def parse_kv(text: str, what: str) -> dict[str, Any]:
    """'process=gamma,rate=5,cv=4' -> {'process': 'gamma', 'rate': 5, 'cv': 4}.

    A value with ';' is a list ('prefix_len=512;1024'); `pieces=DURATION:RATE;...`
    becomes a list of {duration_s, rate} (piecewise arrivals).
    """
    out: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what}: expected key=value pairs separated by commas, got {item!r}")
        key = key.strip()
        if key == "pieces":
            out[key] = [_piece(p, what) for p in value.split(";") if p.strip()]
        elif ";" in value:
            out[key] = [parse_scalar(v) for v in value.split(";") if v.strip()]
        else:
            out[key] = parse_scalar(value)
    return out


def _piece(text: str, what: str) -> dict[str, Any]:
    duration, sep, rate = text.partition(":")
    if not sep:
        raise ValueError(f"{what}: pieces are DURATION_S:RATE separated by ';', got {text!r}")
    return {"duration_s": parse_scalar(duration), "rate": parse_scalar(rate)}


def add_load_options(p: argparse.ArgumentParser) -> None:
    """Options every subcommand that reads a trace takes."""
    g = p.add_argument_group("reading the trace")
    g.add_argument(
        "--format",
        help="azure, mooncake, burstgpt, lengths, generic_csv, generic_jsonl "
        "(default: detected from the header / first record)",
    )
    g.add_argument(
        "--skip-invalid",
        action="store_true",
        help="drop bad rows (reported with their line numbers) instead of failing",
    )
    g.add_argument(
        "--columns",
        metavar="KEY=COL,...",
        help="column mapping, e.g. arrival=ts,prompt_len=in,output_len=out",
    )
    g.add_argument(
        "--option",
        metavar="KEY=VALUE,...",
        action="append",
        default=[],
        help="format options, e.g. model=GPT-4, time_unit=ms, hash_block_size=512",
    )
    g.add_argument(
        "--arrival",
        metavar="KEY=VALUE,...",
        help="arrival process for the lengths format, e.g. process=poisson,rate=5",
    )
    g.add_argument("--seed", type=non_negative_int, default=0, help="seed for arrivals / jitter (default 0)")


def load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for `workloads.load_trace` from the parsed load options."""
    kwargs: dict[str, Any] = {"skip_invalid": args.skip_invalid}
    if args.columns:
        kwargs["columns"] = {k: str(v) for k, v in parse_kv(args.columns, "--columns").items()}
    for text in args.option:
        kwargs.update(parse_kv(text, "--option"))
    if args.arrival:
        kwargs["arrival"] = parse_kv(args.arrival, "--arrival")
        kwargs.setdefault("seed", args.seed)
    return kwargs
