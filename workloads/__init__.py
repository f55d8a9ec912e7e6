"""Request traces: loaders, synthetic traffic and transforms. Imports nothing from simulator/ or realexec/."""
