"""`OpCost` and `StepBreakdown`: what one engine step spent its time on, and what bound it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BOUNDS = ("compute", "memory", "communication", "overhead")


@dataclass(frozen=True)
class OpCost:
    """One operator (summed over the layers it runs in) of one step."""

    name: str
    flops: float
    bytes: float  # bytes moved to/from device memory, or over a link for communication
    time_s: float  # roofline ops: max(c, m) + (1 - CostParams.overlap) x min(c, m)
    bound: str  # one of BOUNDS
    compute_s: float = 0.0  # flops / (peak x efficiency)
    memory_s: float = 0.0  # bytes / (bandwidth x efficiency)
    efficiency: float | None = None  # fraction of the bounding peak this op reached
    source: str = ""  # where that efficiency came from (catalog entry, calibration, default)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "flops": self.flops, "bytes": self.bytes,
                "time_s": self.time_s, "bound": self.bound, "compute_s": self.compute_s,
                "memory_s": self.memory_s, "efficiency": self.efficiency, "source": self.source}


@dataclass
class StepBreakdown:
    """Per-operator costs of one step; `total_s` equals `CostModel.step_time`."""

    total_s: float
    ops: list[OpCost]
    num_tokens: int
    num_reqs: int
    description: dict[str, Any] = field(default_factory=dict)  # model, hardware, tp, pp, dtype

    @property
    def by_bound(self) -> dict[str, float]:
        """Seconds per bound category."""
        out = dict.fromkeys(BOUNDS, 0.0)
        for op in self.ops:
            out[op.bound] += op.time_s
        return out

    @property
    def bound(self) -> str:
        """The category (compute, memory, communication, overhead) with the most time."""
        by = self.by_bound
        return max(BOUNDS, key=lambda b: by[b])

    @property
    def dominant_op(self) -> OpCost:
        """The single operator that took the most time."""
        return max(self.ops, key=lambda op: op.time_s)

    @property
    def tokens_per_s(self) -> float:
        """Tokens computed per second at this step time (prefill + decode tokens)."""
        return self.num_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**self.description, "step_time_s": self.total_s, "num_tokens": self.num_tokens,
                "num_reqs": self.num_reqs, "tokens_per_s": self.tokens_per_s,
                "bound": self.bound, "dominant_op": self.dominant_op.name,
                "time_by_bound_s": self.by_bound, "ops": [op.to_dict() for op in self.ops]}

    def format_table(self, explain: bool = False) -> str:
        """A fixed-width text table of the operators, largest first; with `explain`, each
        operator's efficiency and where it came from."""
        lines = [f"{'operator':22s} {'time ms':>9s} {'share':>6s} {'bound':13s} "
                 f"{'GFLOP':>10s} {'MB moved':>10s}" + ("  efficiency  source" if explain else "")]
        for op in sorted(self.ops, key=lambda o: -o.time_s):
            share = op.time_s / self.total_s if self.total_s else 0.0
            line = (f"{op.name:22s} {op.time_s * 1e3:9.3f} {share:6.1%} {op.bound:13s} "
                    f"{op.flops / 1e9:10.2f} {op.bytes / 1e6:10.2f}")
            if explain:
                eff = "-" if op.efficiency is None else f"{op.efficiency:.3f}"
                line += f"  {eff:>10s}  {op.source}"
            lines.append(line)
        return "\n".join(lines)
