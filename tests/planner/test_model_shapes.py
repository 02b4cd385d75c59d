from __future__ import annotations

import json

import pytest

from jido.planner.model_shapes import CATALOG, ModelShapeError, load_model, shape_from_hf_config


def test_llama_8b_kv_bytes_per_token_is_2_layers_kvheads_headdim_bytes():
    assert CATALOG["llama-3.1-8b"].kv_bytes_per_token(2.0) == 2 * 32 * 8 * 128 * 2 == 131072


def test_llama_8b_kv_for_1024_tokens_is_about_0_134_gb():
    gb = CATALOG["llama-3.1-8b"].kv_bytes(1024) / 1e9
    assert gb == pytest.approx(0.134, abs=1e-3)
    assert 0.13 <= gb <= 0.15


@pytest.mark.parametrize("name, billions", [("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.55),
                                            ("qwen3-32b", 32.76), ("mixtral-8x7b", 46.70),
                                            ("gemma-3-270m", 0.268)])
def test_parameter_counts_match_published_sizes(name, billions):
    assert CATALOG[name].num_params / 1e9 == pytest.approx(billions, rel=0.005)


def test_mixtral_activates_two_of_eight_experts():
    m = CATALOG["mixtral-8x7b"]
    assert m.is_moe and m.num_active_params / 1e9 == pytest.approx(12.6, rel=0.01)


def test_gemma_sliding_layers_keep_only_the_window():
    m = CATALOG["gemma-3-270m"]
    per_layer = 2 * 1 * 256 * 2
    assert m.kv_bytes(4096) == per_layer * (3 * 4096 + 15 * 512)


def test_hf_config_json_is_parsed(tmp_path):
    config = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "intermediate_size": 14336, "vocab_size": 128256}
    path = tmp_path / "llama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    shape = load_model(str(path))
    assert shape.name == "llama" and shape.head_dim == 128
    assert shape.num_params == CATALOG["llama-3.1-8b"].num_params


def test_multimodal_text_config_and_layer_types():
    cfg = {"text_config": {"num_hidden_layers": 6, "hidden_size": 640, "num_attention_heads": 4,
                           "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 2048,
                           "vocab_size": 1000, "sliding_window": 512,
                           "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}}
    shape = shape_from_hf_config(cfg)
    assert shape.num_sliding_layers == 5 and shape.sliding_window == 512


def test_missing_config_field_is_named():
    with pytest.raises(ModelShapeError, match="lacks 'vocab_size'"):
        shape_from_hf_config({"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
                              "intermediate_size": 16})


def test_unknown_model_lists_the_catalog():
    with pytest.raises(ModelShapeError, match="not in the catalog"):
        load_model("gpt-5")
