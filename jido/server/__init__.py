"""The OpenAI-compatible HTTP server: protocol, routes, errors, metrics and the process that runs it."""
