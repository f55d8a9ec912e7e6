"""Trace replay against real serving (in process, ZeroMQ workers or HTTP), writing the same
records and `summary.json` as a simulation."""
