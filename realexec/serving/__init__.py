"""Serving: the engine worker process and its ZeroMQ transport, the front-end clients, the
OpenAI HTTP server, trace replay against real serving, and the PD workers (`pd/`)."""
