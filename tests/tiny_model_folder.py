"""A tiny random Gemma 3 checkpoint folder (weights, config, word-level tokenizer) for jido and transformers."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, Gemma3TextConfig

VOCAB_SIZE = 128
PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
SPECIAL = {PAD_ID: "<pad>", EOS_ID: "<eos>", BOS_ID: "<bos>"}
WORDS = [f"w{i}" for i in range(len(SPECIAL), VOCAB_SIZE)]  # token id i is the word f"w{i}"


def token_text(token_id: int) -> str:
    """The text of one token, special ones included."""
    return SPECIAL.get(token_id, f"w{token_id}")


def write_tiny_model_folder(folder: Path, seed: int = 0, weight_scale: float = 0.15, **config: object) -> Path:
    """Write the checkpoint into ``folder``; the same seed gives the same weights; ``config`` overrides the shape.

    Larger weights and a looser soft-cap make the next-token distributions peaked (a model that repeats
    itself, as real ones do, so that speculative proposals often hold).
    """
    shape = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=16, max_position_embeddings=256, query_pre_attn_scalar=24,
                 sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                 final_logit_softcapping=3.0)
    config = Gemma3TextConfig(vocab_size=VOCAB_SIZE, pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
                              **{**shape, **config})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        # Larger than HF's init, so that the logits are far from uniform and comparisons bite.
        for name, param in model.named_parameters():
            param.copy_(0.1 * torch.randn_like(param) if "norm" in name else weight_scale * torch.randn_like(param))
    model.save_pretrained(folder)
    _tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    return folder


def reference_logprobs(folder: Path, token_ids: list[int]) -> torch.Tensor:
    """transformers' log-softmax in float64 at every position of ``token_ids``: [len, vocab]."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager").eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([token_ids])).logits[0], dim=-1)


def _tokenizer() -> Tokenizer:
    vocab = {**{text: i for i, text in SPECIAL.items()}, **{w: i for i, w in enumerate(WORDS, start=len(SPECIAL))}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(list(SPECIAL.values()))
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS_ID)])
    return tokenizer
