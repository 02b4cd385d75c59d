"""The router's Prometheus metrics: per-instance load and health, routing decisions, fallbacks and latency."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from jido.router.instances import Instance

DECISIONS = ("disaggregated", "local_prefill", "data_parallel", "fallback")
FALLBACK_REASONS = ("producer_error", "producer_timeout", "no_handle", "no_producer")
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


class RouterMetrics:
    """Every series exists from the start (at zero), one child per instance, decision and reason."""

    def __init__(self, instances: list[Instance]) -> None:
        self.registry = CollectorRegistry()
        labels = ["instance", "role"]
        outstanding = Gauge("jido:router_outstanding_tokens", "Estimated prompt + output tokens of the requests "
                            "in flight at an instance (what least-loaded routing compares).", labels,
                            registry=self.registry)
        in_flight = Gauge("jido:router_requests_in_flight", "Requests in flight at an instance.", labels,
                          registry=self.registry)
        healthy = Gauge("jido:router_instance_healthy", "1 while the instance answers its health checks and may get "
                        "requests.", labels, registry=self.registry)
        self._gauges = [(i, outstanding.labels(i.url, i.role), in_flight.labels(i.url, i.role),
                         healthy.labels(i.url, i.role)) for i in instances]
        decisions = Counter("jido:router_requests", "Requests routed, by decision: disaggregated (a prefill "
                            "instance prefilled, the decode instance loaded its KV), local_prefill (short prompt: "
                            "the decode instance prefilled), data_parallel (no prefill pool), fallback (the prefill "
                            "instance failed: the decode instance prefilled).", ["decision"], registry=self.registry)
        self.decisions = {d: decisions.labels(d) for d in DECISIONS}
        fallbacks = Counter("jido:router_fallbacks", "Prefill instance failures answered by a local prefill, by "
                            "reason.", ["reason"], registry=self.registry)
        self.fallbacks = {r: fallbacks.labels(r) for r in FALLBACK_REASONS}
        self.affinity = Counter("jido:router_affinity_hits", "Requests sent to the instance holding their longest "
                                "known prefix.", ["role"], registry=self.registry)
        self.failed = Counter("jido:router_failed_requests", "Requests the router answered with an error.",
                              registry=self.registry)
        self.prefill_time = Histogram("jido:router_prefill_seconds", "Time a prefill instance took to answer "
                                      "(queue and prefill there).", registry=self.registry, buckets=_LATENCY_BUCKETS)
        self.ttft = Histogram("jido:router_time_to_first_token_seconds", "Arrival at the router to the first byte "
                              "of the decode instance's answer.", registry=self.registry, buckets=_LATENCY_BUCKETS)

    def render(self) -> bytes:
        for instance, outstanding, in_flight, healthy in self._gauges:
            outstanding.set(instance.outstanding_tokens)
            in_flight.set(instance.num_requests)
            healthy.set(1 if instance.usable else 0)
        return generate_latest(self.registry)
