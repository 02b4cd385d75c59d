"""benchmarks/perplexity.py: variants become flags, a setting jido lacks fails its row alone, ratios to the first."""
from __future__ import annotations


import pytest
from benchmark_scripts import load_benchmark



@pytest.fixture(scope="module")
def script():
    return load_benchmark("perplexity")


def test_a_variant_is_comma_separated_settings_passed_as_flags(script):
    settings = script.parse_variant("dtype=bfloat16,enable_prefix_caching=false,max_num_seqs=4")
    assert settings == {"dtype": "bfloat16", "enable_prefix_caching": "false", "max_num_seqs": "4"}
    assert script.engine_flags(settings) == ["--dtype", "bfloat16", "--no-enable-prefix-caching",
                                             "--max-num-seqs", "4"]
    with pytest.raises(ValueError, match="'dtype' is not key=value"):
        script.parse_variant("dtype")


def test_a_setting_no_engine_config_has_fails_that_variant_without_running_it(script, tmp_path):
    run = script.Run("no_such_setting=1", {"no_such_setting": "1"})
    script.run_variant(run, tmp_path / "text.txt", [], tmp_path / "lock")
    assert run.record is None and run.error.startswith("no engine setting no_such_setting in this jido (it has: ")
    assert script.unknown_settings({"dtype": "float32"}) is None


def test_table_gives_ratios_to_the_first_variant_and_the_reason_of_a_failed_one(script):
    record = {"perplexity": 20.0, "stderr": 0.5, "tokens_per_s": 100.0, "dtype": "float32",
              "num_scored_tokens": 510}
    bf16 = {**record, "perplexity": 20.2, "tokens_per_s": 150.0, "dtype": "bfloat16"}
    runs = [script.Run("dtype=float32", {}, record), script.Run("dtype=bfloat16", {}, bf16),
            script.Run("quantization=int8", {}, error="a | b")]
    rows = script.markdown_table(runs).splitlines()[2:]
    assert rows[0] == "| dtype=float32 | 20.0000 | 0.5000 | 1.0000 | 100.0 | 1.00 | float32 | 510 |"
    assert rows[1] == "| dtype=bfloat16 | 20.2000 | 0.5000 | 1.0100 | 150.0 | 1.50 | bfloat16 | 510 |"
    assert rows[2] == "| quantization=int8 | failed: a \\| b | | | | | | |"
