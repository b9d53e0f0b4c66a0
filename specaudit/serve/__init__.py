"""The reference runtime behind an OpenAI-compatible HTTP API, traced live."""
