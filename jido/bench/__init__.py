"""jido bench: a load generator for any OpenAI-compatible server; it talks HTTP only, never to the engine."""
