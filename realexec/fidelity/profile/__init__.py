"""`kvpd profile`: the step grid, host facts and contention, PD KV transfer timings and the
serving probe, written as one profile for `kvpd calibrate`."""
