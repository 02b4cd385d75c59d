"""A tiny random Gemma 3 with the default model's tokenizer, for tests that need many cheap generations."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from jido.models.loader import resolve_model

# A one-layer Gemma 3 with the default model's tokenizer and chat template: every id and every text the real
# model takes, at a small fraction of its cost per token, for tests that need many generations, not good ones.
_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 32, "query_pre_attn_scalar": 32, "layer_types": ["full_attention"]}


def make_tiny_model(folder: Path) -> Path:
    """Write the tiny random Gemma 3 into ``folder`` (an HF folder jido loads like any other) and return it."""
    default = resolve_model(None)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(default / name, folder / name)
    config = {**json.loads((default / "config.json").read_text()), **_TINY}
    (folder / "config.json").write_text(json.dumps(config))
    hidden, ffn, head_dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    layer = {"input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
             "pre_feedforward_layernorm": (hidden,), "post_feedforward_layernorm": (hidden,),
             "self_attn.q_norm": (head_dim,), "self_attn.k_norm": (head_dim,),
             "self_attn.q_proj": (config["num_attention_heads"] * head_dim, hidden),
             "self_attn.k_proj": (config["num_key_value_heads"] * head_dim, hidden),
             "self_attn.v_proj": (config["num_key_value_heads"] * head_dim, hidden),
             "self_attn.o_proj": (hidden, config["num_attention_heads"] * head_dim),
             "mlp.gate_proj": (ffn, hidden), "mlp.up_proj": (ffn, hidden), "mlp.down_proj": (hidden, ffn)}
    shapes.update({f"model.layers.0.{name}.weight": shape for name, shape in layer.items()})
    generator = torch.Generator().manual_seed(0)
    save_file({name: 0.1 * torch.randn(shape, generator=generator) for name, shape in shapes.items()},
              str(folder / "model.safetensors"))
    return folder
