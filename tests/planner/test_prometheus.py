"""Reading Prometheus text: counters under either TYPE name, escaped labels, and text that is not Prometheus."""
from __future__ import annotations

import pytest

from jido.planner.prometheus import MetricsError, parse_metrics

SAMPLE = 'vllm:prompt_tokens_total{model_name="my \\"m\\"",engine="0"} 3.0\n'


@pytest.mark.parametrize("header", [
    "# HELP vllm:prompt_tokens_total Prompt tokens.\n# TYPE vllm:prompt_tokens_total counter\n",  # prometheus_client
    "# HELP vllm:prompt_tokens Prompt tokens.\n# TYPE vllm:prompt_tokens counter\n",  # jido's old exporter
    "",  # untyped
])
def test_a_counter_reads_the_same_whichever_name_its_type_line_gives(header):
    metrics = parse_metrics(header + SAMPLE)
    assert metrics.samples == {"vllm:prompt_tokens_total": [({"model_name": 'my "m"', "engine": "0"}, 3.0)]}
    assert metrics.total("vllm:prompt_tokens") == 3.0


def test_a_counter_sample_without_total_is_still_found_by_its_name():
    metrics = parse_metrics("# TYPE requests counter\nrequests 4\n")
    assert metrics.total("requests") == 4.0


@pytest.mark.parametrize("text", ["<html><body>Not found</body></html>", "vllm:x{model_name=\"m\" 1", "vllm:x one"])
def test_text_that_is_not_prometheus_raises_metrics_error(text):
    with pytest.raises(MetricsError, match="^not Prometheus text: "):
        parse_metrics(text)
