"""What a simulated cluster costs: accelerators and USD per hour from the hardware
catalog's `price_per_hour` (on-demand list prices, see simulator/catalog/hardware.yaml),
or from a user cost table that overrides it; unknown prices are reported, not guessed."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cost.catalog_match import close_matches, normalize_name
from simulator.cost.hardware import list_accelerators
from simulator.preflight import hardware_specs
from simulator.scenario import Scenario

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class ClusterCost:
    gpus: int  # accelerators in the cluster
    usd_per_hour: float | None  # None: some accelerator has no known price
    unpriced: tuple[str, ...] = ()  # accelerator names without a price
    # (accelerator, USD per GPU-hour, where the price came from) for each priced accelerator
    prices: tuple[tuple[str, float, str], ...] = ()

    def price_text(self) -> str:
        """The price assumption, e.g. "h100-sxm $2.99/GPU-h (catalog list price)"."""
        return "; ".join(f"{name} ${usd:g}/GPU-h ({src})" for name, usd, src in self.prices)

    def note(self) -> str:
        if self.usd_per_hour is not None:
            return ""
        return (f"cost unknown: no price for {', '.join(self.unpriced)} in the hardware catalog; "
                f"give one in a cost table")


def cluster_cost(sc: Scenario, cost_table: dict[str, float] | None = None) -> ClusterCost:
    """Accelerators and USD/hour of `sc`'s cluster; `cost_table` maps names to USD/hour."""
    from simulator.cluster.cluster import resolve_hardware

    table = {normalize_name(k): float(v) for k, v in (cost_table or {}).items()}
    gpus, total, unpriced, prices = 0, 0.0, [], {}
    for role, count, hw in hardware_specs(sc):
        acc, _ = resolve_hardware(hw, sc, role)
        price, source = table.get(normalize_name(acc.name)), "cost table"
        if price is None and isinstance(hw, str):
            price = table.get(normalize_name(hw))
        if price is None:
            price, source = acc.price_per_hour, "catalog on-demand list price"
        gpus += count
        if price is None:
            unpriced.append(acc.name)
        else:
            total += price * count
            prices[acc.name] = (acc.name, price, source)
    return ClusterCost(gpus, None if unpriced else total, tuple(dict.fromkeys(unpriced)),
                       tuple(prices.values()))


def cost_metrics(summary: dict, cost: ClusterCost) -> dict[str, float | int | None]:
    """`cost.*` columns: accelerators, USD/hour, USD per million output tokens, and good
    (SLO-meeting) requests per USD, from a run summary."""
    out_tps = summary["throughput"]["output_tokens_per_s"]
    goodput = summary["slo"]["goodput_rps"]
    usd_h = cost.usd_per_hour
    per_m = per_usd = None
    if usd_h is not None and usd_h > 0:
        per_m = usd_h / (out_tps * SECONDS_PER_HOUR) * 1e6 if out_tps > 0 else None
        per_usd = goodput * SECONDS_PER_HOUR / usd_h
    return {"gpus": cost.gpus, "usd_per_hour": usd_h, "usd_per_m_output_tokens": per_m,
            "good_requests_per_usd": per_usd}


def check_cost_table_names(table: dict[str, float], used: list[str], where: str,
                           runner: str = "candidate") -> None:
    """ValueError for a cost-table name that is neither a catalog accelerator nor one a
    `runner` (a capacity candidate, a sweep point) runs on: a typo would leave that part's
    price silently unknown."""
    known = {normalize_name(n) for n in [*list_accelerators(), *used]}
    for name in table:
        if normalize_name(name) not in known:
            close = close_matches(name, [*used, *list_accelerators()], n=3)
            raise ValueError(f"{where}: {name!r} is neither a catalog accelerator nor one a "
                             f"{runner} runs on ({', '.join(used)})"
                             + (f"; did you mean {', '.join(close)}?" if close else ""))
