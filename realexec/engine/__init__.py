"""The real executor: `LLM` over the shared core, the model runner, the paged model walk and
attention, the KV-cache tensors, the sampler, model loading and built-in configs."""
