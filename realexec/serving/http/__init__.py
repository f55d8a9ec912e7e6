"""The OpenAI-compatible HTTP front end: request validation and response shapes (`protocol`),
the FastAPI app (`server`)."""
