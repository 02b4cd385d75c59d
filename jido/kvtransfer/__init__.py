"""KV connectors: the scheduler and worker halves that move KV between the device pool and the outside."""
