"""What a step costs: the hardware and model catalogs, parallelism, the memory plan, cost
parameters, the roofline cost model and its per-operator breakdown, host sharing."""
