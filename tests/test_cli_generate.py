"""`jido generate --json`: the same tokens as `LLM.generate` (float32 both), with TTFT, decode tok/s and the step split."""
from __future__ import annotations

import json

import pytest

from jido.cli import main
from jido.core.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Once upon a time"]
MAX_TOKENS = 4


def test_generate_json_reports_the_tokens_and_sane_timing_per_prompt(llm, capsys):
    argv = ["--log-level", "warning", "generate", "--json", "--max-tokens", str(MAX_TOKENS), "--temperature", "0",
            "--ignore-eos", "--kv-cache-memory", "160MiB", "--dtype", "float32", *PROMPTS]
    assert main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [line["token_ids"] for line in lines] == [e.outputs[0].token_ids for e in expected]
    for line in lines:
        timing = line["timing"]
        assert set(timing) == {"ttft_s", "e2e_s", "num_output_tokens", "decode_tok_s", "steps"}
        assert 0 < timing["ttft_s"] < timing["e2e_s"]
        assert timing["num_output_tokens"] == MAX_TOKENS
        # The first token comes with the prefill; the other three from one decode step each.
        assert timing["decode_tok_s"] == pytest.approx((MAX_TOKENS - 1) / (timing["e2e_s"] - timing["ttft_s"]))
        steps = timing["steps"]
        assert steps["num_steps"] == MAX_TOKENS  # both prompts prefill in the first step
        assert all(steps[k] >= 0 for k in ("schedule_s", "sample_s", "other_s")) and steps["model_s"] > 0
        assert steps["schedule_s"] + steps["model_s"] + steps["sample_s"] + steps["other_s"] == pytest.approx(
            steps["total_s"])
        assert steps["total_s"] <= timing["e2e_s"] + 1e-6
    assert lines[0]["timing"]["steps"] == lines[1]["timing"]["steps"]  # one batch, one run
