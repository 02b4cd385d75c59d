"""The numbers of one run, under ``vllm bench serve``'s result keys: throughput, latency percentiles, goodput."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jido.bench.client import RequestOutcome

PERCENTILES = (90, 95, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")


def tpot(outcome: RequestOutcome) -> float | None:
    """Time per output token after the first, in seconds; None for a one-token answer."""
    if outcome.output_len < 2:
        return None
    return (outcome.latency - outcome.ttft) / (outcome.output_len - 1)


def latency_samples_ms(outcomes: Sequence[RequestOutcome]) -> dict[str, list[float]]:
    """Per-request TTFT, TPOT, E2E latency and every inter-chunk gap, in milliseconds, of the successes."""
    done = [o for o in outcomes if o.success]
    tpots = [t for t in map(tpot, done) if t is not None]
    return {"ttft": [o.ttft * 1000 for o in done], "tpot": [t * 1000 for t in tpots],
            "itl": [gap * 1000 for o in done for gap in o.itl], "e2el": [o.latency * 1000 for o in done]}


def summarize(outcomes: Sequence[RequestOutcome], duration_s: float, slos_ms: dict[str, float]) -> dict[str, Any]:
    """vLLM's result keys for the run (failed requests count only in `failed` and `errors`)."""
    done = [o for o in outcomes if o.success]
    input_tokens = sum(o.prompt_len for o in done)
    output_tokens = sum(o.output_len for o in done)
    result: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(outcomes) - len(done),
        "first_errors": first_errors([o.error for o in outcomes]),
        "num_retries": sum(o.num_retries for o in outcomes),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration_s,
        "request_goodput": _num_good(done, slos_ms) / duration_s if slos_ms else None,
        "output_throughput": output_tokens / duration_s,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s,
    }
    for name, values in latency_samples_ms(outcomes).items():
        result.update(distribution(name, values))
    result.update({"input_lens": [o.prompt_len for o in outcomes], "output_lens": [o.output_len for o in outcomes],
                   "ttfts": [o.ttft for o in outcomes], "itls": [o.itl for o in outcomes],
                   "tpots": [tpot(o) for o in outcomes], "e2els": [o.latency for o in outcomes],
                   "errors": [o.error for o in outcomes]})
    return result


def distribution(name: str, values_ms: Sequence[float]) -> dict[str, float | None]:
    """mean_, median_, std_ and pNN_ keys of `name` in ms; None when there are no values.

    vLLM writes zeros there, which reads as "instant" (one-token answers have no TPOT or ITL at all).
    """
    values = np.asarray(values_ms, dtype=float)
    keys = [f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms", *(f"p{p}_{name}_ms" for p in PERCENTILES)]
    if not len(values):
        return dict.fromkeys(keys)
    figures = [values.mean(), np.median(values), values.std(), *(np.percentile(values, p) for p in PERCENTILES)]
    return {key: float(value) for key, value in zip(keys, figures)}


def first_errors(errors: Sequence[str], limit: int = 5) -> list[dict[str, Any]]:
    """The distinct error messages in the order they first occurred, each with how often (at most `limit`)."""
    counts: dict[str, int] = {}
    for error in errors:
        if error:
            counts[error] = counts.get(error, 0) + 1
    return [{"count": count, "error": error} for error, count in list(counts.items())[:limit]]


def _num_good(done: Sequence[RequestOutcome], slos_ms: dict[str, float]) -> int:
    """Requests that met every SLO given (a one-token answer has no TPOT and passes that one)."""
    def good(o: RequestOutcome) -> bool:
        measured = {"ttft": o.ttft * 1000, "tpot": (tpot(o) or 0.0) * 1000, "e2el": o.latency * 1000}
        return all(measured[key] <= limit for key, limit in slos_ms.items())
    return sum(map(good, done))
