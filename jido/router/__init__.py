"""The router: an OpenAI-compatible proxy in front of prefill/decode or data-parallel jido instances (HTTP only)."""
