"""The SimPy model of a deployment: replicas running the shared core on a cost-model clock,
routers, fair-shared KV links, PD topology, and the per-step timeline."""
