"""Planning on top of simulation: sweeps over any scenario key (local processes or Ray),
capacity search under SLOs, candidate deployments priced in accelerators and dollars, and
their reports."""
