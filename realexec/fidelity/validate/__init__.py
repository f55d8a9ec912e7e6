"""`kvpd validate`: what it runs (plan), the speed probes, the real and simulated runs
(validation), their reports, and finding a run's own steps in the logs."""
