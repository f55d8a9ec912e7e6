"""Cheap checks of a scenario before anything is simulated: catalog names (model, hardware,
link), the model config and trace files, and the synthetic spec. Every error names the key
path, the value and what is allowed, so `kvpd simulate`, sweeps and capacity search report a
typo up front (prefixed with the scenario file by the caller) instead of deep in a run.
With `pools=True` (`kvpd simulate`, which runs one scenario) it also plans each pool, so a
precision the part cannot run or a memory plan with no room for KV blocks is refused before
any run starts; sweeps and capacity search leave that to each point, which records it as that
point's failure."""

from __future__ import annotations

from functools import lru_cache

import workloads
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


def _keyed(key: str, call, *args) -> None:
    """Run `call(*args)`; re-raise its ValueError / FileNotFoundError prefixed with `key`."""
    try:
        call(*args)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{key}: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def preflight_as(sc: Scenario, where: str, pools: bool = False) -> None:
    """`preflight`, its errors prefixed with `where` (the scenario file, a candidate, ...)."""
    _keyed(where, preflight, sc, pools)


def preflight(sc: Scenario, pools: bool = False) -> None:
    """Raise ValueError / FileNotFoundError naming the key path when a name or file is wrong
    (and with `pools`, when a pool cannot be planned)."""
    from simulator.cluster.cluster import plan_pool, pool_specs, resolve_hardware

    model = sc.model
    if isinstance(model, str):
        is_path = model.endswith(".json") or model.startswith((".", "/", "~"))
        _keyed("model", _model, str(sc.resolve(model)) if is_path else model)
    if sc.hf_overrides:  # the model with them: a bad value is named by its config key
        _keyed("hf_overrides", sc.model_spec)
    for role, _, hw in hardware_specs(sc):  # names, inline specs, calibrations, speeds
        where = "hardware" if role == "colocated" else f"cluster.pd.{role}.hardware"
        _keyed(where, resolve_hardware, hw, sc, role)
    if sc.cluster.pd is not None and isinstance(sc.cluster.pd.link, str):
        _keyed("cluster.pd.link", _link, sc.cluster.pd.link)
    w = sc.workload
    if w.trace and w.synthetic:
        raise ValueError("workload: give either 'trace' or 'synthetic', not both")
    if not w.trace and not w.synthetic:
        raise ValueError("workload: needs a 'trace' file or a 'synthetic' spec")
    if w.trace and not sc.resolve(w.trace).is_file():
        raise FileNotFoundError(f"workload.trace: no such file: {sc.resolve(w.trace)} "
                                f"(relative paths start from the scenario's folder)")
    if w.synthetic:
        workloads.validate_spec(w.synthetic, where="workload.synthetic")
    if sc.scheduler.max_model_len is not None:
        sc.max_model_len()  # past the model's context: refused, as vLLM does
    if pools:
        model_spec = sc.model_spec()
        for role, pool in pool_specs(sc):  # errors name the pool and the scenario keys
            plan_pool(sc, model_spec, pool, role)
