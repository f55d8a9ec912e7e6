"""Simulator: the clock-free core (`simulator.core`), hardware/model catalogs, cost model, SimPy cluster, metrics, scenarios."""
