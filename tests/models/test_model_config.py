"""ModelArchConfig reads transformers-4 and transformers-5 config.json layouts and rejects what we cannot run."""
from __future__ import annotations

import pytest

from jido.layers.rotary import RopeScaling
from jido.models.config import ModelArchConfig

_SHAPES = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 6}
GEMMA3_270M = {  # transformers-4 layout, as in google/gemma-3-270m's config.json
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attn_logit_softcapping": None,
    "bos_token_id": 2, "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640, "intermediate_size": 2048,
    "max_position_embeddings": 32768, "num_attention_heads": 4, "num_hidden_layers": 18, "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
    "rope_theta": 1000000.0, "sliding_window": 512, "tie_word_embeddings": True, "vocab_size": 262144,
    "_sliding_window_pattern": 6,
}


def test_gemma3_270m_has_five_sliding_layers_of_six_with_their_own_rope_base() -> None:
    c = ModelArchConfig.from_hf_config(GEMMA3_270M)
    assert c.sliding_windows == (512, 512, 512, 512, 512, None) * 3
    assert [c.layer_rope(i) for i in (0, 5)] == [(10_000.0, None), (1_000_000.0, None)]
    assert (c.head_dim, c.num_kv_heads, c.attn_scale, c.qk_norm) == (256, 1, 256**-0.5, True)
    assert (c.tie_word_embeddings, c.hidden_act) == (True, "gelu_pytorch_tanh")
    assert (c.bos_token_id, c.eos_token_ids) == (2, (1, 106))


def test_gemma3_layer_types_take_precedence_over_the_pattern() -> None:
    types = ["sliding_attention", "full_attention"] * 9
    c = ModelArchConfig.from_hf_config({**GEMMA3_270M, "layer_types": types})
    assert c.sliding_windows == (512, None) * 9


def test_gemma3_multimodal_config_reads_text_config_and_per_layer_type_rope_parameters() -> None:
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    text = {k: v for k, v in GEMMA3_270M.items() if k not in ("architectures", "eos_token_id")}
    c = ModelArchConfig.from_hf_config({
        "architectures": ["Gemma3ForConditionalGeneration"], "eos_token_id": [1, 106],
        "text_config": {**text, "rope_parameters": rope, "rope_theta": None, "rope_local_base_freq": None},
    })
    assert c.architecture == "Gemma3ForCausalLM"
    assert c.layer_rope(5) == (1e6, RopeScaling("linear", 8.0))
    assert c.layer_rope(0) == (1e4, None)
    assert c.eos_token_ids == (1, 106)


def test_llama31_rope_scaling_in_both_layouts() -> None:
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    v4 = {"architectures": ["LlamaForCausalLM"], **_SHAPES, "rope_theta": 500000.0, "rope_scaling": scaling,
          "eos_token_id": [128001, 128008, 128009], "bos_token_id": 128000}
    v5 = {**v4, "rope_scaling": None, "rope_theta": None, "rope_parameters": {**scaling, "rope_theta": 500000.0}}
    expected = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    for cfg in (v4, v5):
        c = ModelArchConfig.from_hf_config(cfg)
        assert (c.rope_theta, c.rope_scaling, c.sliding_windows) == (500000.0, expected, (None,) * 6)
        assert (c.head_dim, c.tie_word_embeddings, c.qkv_bias, c.eos_token_ids[-1]) == (16, False, False, 128009)


def test_qwen2_has_qkv_bias_and_ignores_a_disabled_sliding_window() -> None:
    cfg = {"architectures": ["Qwen2ForCausalLM"], **_SHAPES, "sliding_window": 131072,
           "use_sliding_window": False, "max_window_layers": 2, "tie_word_embeddings": True}
    c = ModelArchConfig.from_hf_config(cfg)
    assert (c.qkv_bias, c.o_bias, c.qk_norm, c.tie_word_embeddings) == (True, False, False, True)
    assert c.sliding_windows == (None,) * 6
    enabled = ModelArchConfig.from_hf_config({**cfg, "use_sliding_window": True})
    assert enabled.sliding_windows == (None, None) + (131072,) * 4


def test_unsupported_architecture_lists_the_supported_ones() -> None:
    expected = r"unsupported model architecture 'MistralForCausalLM'; supported: .*LlamaForCausalLM"
    with pytest.raises(ValueError, match=expected):
        ModelArchConfig.from_hf_config({"architectures": ["MistralForCausalLM"], **_SHAPES})


def test_unsupported_rope_scaling_is_rejected() -> None:
    cfg = {"architectures": ["LlamaForCausalLM"], **_SHAPES, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(ValueError, match="unsupported rope scaling type 'yarn'"):
        ModelArchConfig.from_hf_config(cfg)


def test_heads_must_divide_into_kv_groups() -> None:
    with pytest.raises(ValueError, match=r"num_heads \(4\) must be a multiple of num_kv_heads \(3\)"):
        ModelArchConfig.from_hf_config({"architectures": ["LlamaForCausalLM"], **_SHAPES, "num_key_value_heads": 3})
