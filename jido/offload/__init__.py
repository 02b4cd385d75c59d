"""KV offload storage: byte stores (CPU memory, disk, Redis) keyed by block hash, and the entry format they hold."""
