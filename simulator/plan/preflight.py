"""Cheap checks of a scenario before a sweep or capacity search starts simulating:
catalog names (model, hardware, link) and the trace file, so a typo in one point is
reported up front instead of failing that point minutes later."""

from __future__ import annotations

from functools import lru_cache

from simulator.scenario import Scenario


@lru_cache(maxsize=256)
def _model(key: str) -> None:
    from simulator.cost.models import get_model

    get_model(key)


@lru_cache(maxsize=256)
def _link(key: str) -> None:
    from simulator.cost.hardware import get_link

    get_link(key)


def hardware_specs(sc: Scenario) -> list[tuple[str, int, object]]:
    """(role, accelerators, hardware spec) for each pool of the scenario's cluster."""
    c = sc.cluster
    if c.pd is None:
        return [("colocated", c.replicas * c.tp * c.pp, sc.hardware)]
    return [(role, p.replicas * p.tp * p.pp, p.hardware or sc.hardware)
            for role, p in (("prefill", c.pd.prefill), ("decode", c.pd.decode))]


def preflight(sc: Scenario) -> None:
    """Raise ValueError / FileNotFoundError naming the field when a name or file is wrong."""
    from simulator.cluster.cluster import resolve_hardware

    model = sc.model
    if isinstance(model, str):
        _model(str(sc.resolve(model)) if model.endswith(".json") else model)
    for role, _, hw in hardware_specs(sc):  # names, inline specs, calibrations, speeds
        where = "hardware" if role == "colocated" else f"cluster.pd.{role}.hardware"
        try:
            resolve_hardware(hw, sc, role)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{where}: {exc}") from None
    if sc.cluster.pd is not None and isinstance(sc.cluster.pd.link, str):
        try:
            _link(sc.cluster.pd.link)
        except ValueError as exc:
            raise ValueError(f"cluster.pd.link: {exc}") from None
    w = sc.workload
    if w.trace and not sc.resolve(w.trace).exists():
        raise FileNotFoundError(f"workload.trace: file not found: {sc.resolve(w.trace)}")
    if not w.trace and not w.synthetic:
        raise ValueError("workload: needs a 'trace' file or a 'synthetic' spec")
