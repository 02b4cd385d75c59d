"""jido bench's per-tier KV offload deltas from /metrics: counters over the run, hit rate, mean load latency."""
from __future__ import annotations

from jido.bench.server_metrics import offload_deltas
from jido.planner.prometheus import parse_metrics


def _metrics(hits: int, misses: int, loaded: int, seconds: float):
    return parse_metrics("\n".join(
        f'jido:kv_offload_{key}_total{{model_name="m",tier="cpu"}} {value}'
        for key, value in (("hits", hits), ("misses", misses), ("loaded_blocks", loaded), ("loaded_bytes", loaded * 10),
                           ("load_seconds", seconds), ("stored_bytes", 0), ("errors", 0))) + "\n")


def test_offload_deltas_cover_the_run_alone():
    tiers = offload_deltas(_metrics(10, 10, 5, 0.5), _metrics(40, 20, 25, 1.5))
    assert tiers == {"cpu": {"hits": 30, "misses": 10, "loaded_blocks": 20, "loaded_bytes": 200, "load_seconds": 1.0,
                             "stored_bytes": 0, "errors": 0, "hit_rate": 0.75, "mean_load_ms": 50.0}}
