"""PD disaggregation workers: prefill side (send prompt KV), decode side (receive and land it),
the KV wire format, the receiver thread and the proxy's routing policy."""
