"""Tiny random checkpoint folders of every model family (weights, config, word-level tokenizer), for engines."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedConfig

from tiny_hf_models import tiny_hf_config  # tests/models is on sys.path (see conftest.py)
from tiny_model_folder import BOS_ID, EOS_ID, PAD_ID, _tokenizer

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3", "qwen3_moe")


def family_config(arch: str) -> PreTrainedConfig:
    """tests/models' config of each family, with the tokenizer's special ids."""
    config = tiny_hf_config(arch)
    config.pad_token_id, config.eos_token_id, config.bos_token_id = PAD_ID, EOS_ID, BOS_ID
    return config


def write_family_folder(folder: Path, arch: str, seed: int = 0) -> Path:
    """A checkpoint of ``arch`` with weights large enough that greedy tokens depend on every layer."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(arch)).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            center = 1.0 if "norm" in name and arch != "gemma3" else 0.0
            param.copy_(center + (0.1 if "norm" in name else 0.15) * torch.randn_like(param))
    model.save_pretrained(folder)
    _tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    return folder
