"""The modelled side: `core/` (the clock-free scheduler and KV cache both backends run),
`cost/` (what a step costs), `cluster/` (the SimPy deployment), `calibrate/` (fits to real
profiles), `plan/` (sweeps and capacity); `scenario`, `run`, `metrics`, `plots`, `report` turn
a scenario into results."""

from simulator import native as _native

_native.install()  # the core compiled by `kvpd native build`, when one matches its sources
