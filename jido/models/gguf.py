"""Reads GGUF files: metadata, tensors (raw or dequantized to float32), and the mapping to HF names and config."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.gguf_reader import ReaderTensor
from gguf.quants import dequantize
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from jido.models import gguf_blocks

GGUF_MAGIC = b"GGUF"

# The names llama.cpp gives a tensor inside a block, and the HF (transformers) names they came from.
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 wraps both sublayers in norms, so llama.cpp's `ffn_norm` is the *pre*-feed-forward one.
_GEMMA3_BLOCK_NAMES = _BLOCK_NAMES | {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_PATTERN = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_TOP_PATTERN = re.compile(r"(\w+)\.(weight|bias)")


@dataclass(frozen=True)
class ArchSpec:
    """How one llama.cpp architecture maps onto its transformers model class."""

    hf_architecture: str
    model_type: str
    hidden_act_key: str
    hidden_act: str
    block_names: dict[str, str] = field(default_factory=lambda: dict(_BLOCK_NAMES))
    # llama.cpp stores Gemma's RMSNorm weights as (1 + w); HF keeps w.
    norm_offset: float = 0.0
    # llama.cpp interleaves the rotary halves of q/k rows for llama; transformers undoes it.
    permute_qk: bool = False


ARCHS = {
    "gemma3": ArchSpec("Gemma3ForCausalLM", "gemma3_text", "hidden_activation", "gelu_pytorch_tanh",
                       dict(_GEMMA3_BLOCK_NAMES), norm_offset=1.0),
    "llama": ArchSpec("LlamaForCausalLM", "llama", "hidden_act", "silu", permute_qk=True),
    "qwen2": ArchSpec("Qwen2ForCausalLM", "qwen2", "hidden_act", "silu"),
    "qwen3": ArchSpec("Qwen3ForCausalLM", "qwen3", "hidden_act", "silu"),
}


@dataclass(frozen=True)
class GGUFFile:
    """An opened GGUF file: its metadata as Python values and its (still quantized) tensors."""

    path: Path
    metadata: dict[str, Any]
    tensors: list[ReaderTensor]

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]

    @property
    def spec(self) -> ArchSpec:
        return ARCHS[self.architecture]

    def arch_value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)


def is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def open_gguf(path: Path) -> GGUFFile:
    """Open a GGUF file.

    Raises:
        ValueError: a file gguf-py cannot read (cut short, or corrupt), or an architecture jido has no model for.
    """
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError) as exc:  # gguf-py's errors where bytes are missing or wrong
        raise _unreadable(path, exc) from exc
    return _checked(GGUFFile(path, {key: f.contents() for key, f in reader.fields.items()}, list(reader.tensors)))


def _unreadable(path: Path, exc: Exception) -> ValueError:
    return ValueError(f"{path}: not a readable GGUF file, cut short or corrupt ({type(exc).__name__}: {exc}); "
                      "copy or download it again")


def _checked(model: GGUFFile) -> GGUFFile:
    """``model``, or ValueError where jido has no model for its architecture."""
    arch = model.metadata.get("general.architecture")
    if arch not in ARCHS:
        raise ValueError(f"{model.path}: GGUF architecture {arch!r} is not supported; supported: {sorted(ARCHS)}")
    return model


class IndexedTensor(NamedTuple):
    """A tensor found by :func:`open_gguf_index`: what :func:`iter_raw_tensors` reads of gguf-py's ReaderTensor."""

    name: str
    shape: tuple[int, ...]  # as GGUF lists dimensions: innermost first
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # uint8, the tensor's bytes in the memory-mapped file


# GGUF value types (gguf-py's GGUFValueType) with a fixed size: struct format of one value.
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")


def open_gguf_index(path: Path) -> GGUFFile:
    """Open a GGUF file for its tensors alone: scalar and string metadata, array metadata (the vocabulary) skipped,
    and each tensor's bytes a view of the file mapped read-only (the page cache, shared between processes).

    gguf-py's reader turns every vocabulary entry into numpy views (seconds for a 262k-token vocabulary); loading
    weights needs none of them. Raises ValueError as :func:`open_gguf` does.
    """
    try:
        model = _index(path, np.memmap(path, dtype=np.uint8, mode="r"))
    except (ValueError, IndexError, KeyError, OSError, struct.error) as exc:
        raise _unreadable(path, exc) from exc
    return _checked(model)


def _index(path: Path, mapped: np.ndarray) -> GGUFFile:
    buffer = memoryview(mapped)
    if bytes(buffer[:4]) != GGUF_MAGIC:
        raise ValueError("no GGUF magic")
    version, num_tensors, num_kv = struct.unpack_from("<IQQ", buffer, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported (2 or later)")
    offset = 24
    metadata: dict[str, Any] = {}
    for _ in range(num_kv):
        key, offset = _string(buffer, offset)
        (value_type,), offset = struct.unpack_from("<I", buffer, offset), offset + 4
        metadata[key], offset = _value(buffer, offset, value_type)
    infos = []
    for _ in range(num_tensors):
        name, offset = _string(buffer, offset)
        (num_dims,), offset = struct.unpack_from("<I", buffer, offset), offset + 4
        dims = struct.unpack_from(f"<{num_dims}Q", buffer, offset)
        tensor_type, data_offset = struct.unpack_from("<IQ", buffer, offset + 8 * num_dims)
        offset += 8 * num_dims + 12
        infos.append((name, tuple(int(d) for d in dims), GGMLQuantizationType(tensor_type), data_offset))
    alignment = int(metadata.get("general.alignment", 32))
    start = -(-offset // alignment) * alignment
    tensors = []
    for name, dims, tensor_type, data_offset in infos:
        block_size, type_size = GGML_QUANT_SIZES[tensor_type]
        nbytes = int(np.prod(dims)) // block_size * type_size
        begin = start + data_offset
        if begin + nbytes > mapped.size:
            raise ValueError(f"tensor {name} ends past the end of the file ({mapped.size} bytes)")
        tensors.append(IndexedTensor(name, dims, tensor_type, mapped[begin:begin + nbytes]))
    return GGUFFile(path, metadata, tensors)  # type: ignore[arg-type]


def _string(buffer: memoryview, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buffer, offset)
    end = offset + 8 + length
    if end > len(buffer):
        raise ValueError("a string runs past the end of the file")
    return bytes(buffer[offset + 8:end]).decode("utf-8", errors="replace"), end


def _value(buffer: memoryview, offset: int, value_type: int) -> tuple[Any, int]:
    """One metadata value and the offset after it; an array is skipped (None)."""
    if value_type == _STRING:
        return _string(buffer, offset)
    if value_type in _FIXED:
        fmt = "<" + _FIXED[value_type]
        return struct.unpack_from(fmt, buffer, offset)[0], offset + struct.calcsize(fmt)
    if value_type != _ARRAY:
        raise ValueError(f"unknown GGUF value type {value_type}")
    item_type, count = struct.unpack_from("<IQ", buffer, offset)
    offset += 12
    if item_type in _FIXED:
        return None, offset + count * struct.calcsize("<" + _FIXED[item_type])
    if item_type == _STRING:  # the vocabulary: each string's length read to step over it, none decoded
        for _ in range(count):
            offset += 8 + _LENGTH.unpack_from(buffer, offset)[0]
        if offset > len(buffer):
            raise ValueError("a string runs past the end of the file")
        return None, offset
    for _ in range(count):  # nested arrays: walked, not kept
        offset = _value(buffer, offset, item_type)[1]
    return None, offset


def hf_name(gguf_name: str, spec: ArchSpec) -> str | None:
    """The transformers parameter name for a GGUF tensor, or None for one HF does not have."""
    if m := _BLOCK_PATTERN.fullmatch(gguf_name):
        part = spec.block_names.get(m[2])
        return f"model.layers.{m[1]}.{part}.{m[3]}" if part else None
    if m := _TOP_PATTERN.fullmatch(gguf_name):
        part = _TOP_NAMES.get(m[1])
        return f"{part}.{m[2]}" if part else None
    return None


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (convert_hf_to_gguf.py `permute`), as transformers does."""
    half = weight.shape[0] // num_heads // 2
    # [num_heads, 2, half, ...] in HF order was written as [num_heads, half, 2, ...]
    w = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return w.swapaxes(2, 1).reshape(weight.shape)


class RawTensor(NamedTuple):
    """A GGUF tensor still in its GGML encoding, under its HF name and with its rows in HF order."""

    name: str
    data: np.ndarray  # uint8 [*shape[:-1], bytes per row]: whole quantization blocks per row
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # the HF shape, e.g. [out_features, in_features]

    def dequantize(self) -> np.ndarray:
        """The tensor in float32, shaped ``shape``: the gguf package's values, by the faster decoders where they
        are the same bit for bit."""
        if gguf_blocks.dequantizes_exactly(self.tensor_type):
            matrix = (int(np.prod(self.shape[:-1])), self.shape[-1])
            return gguf_blocks.dequantize(self.data, self.tensor_type, matrix).numpy().reshape(self.shape)
        values = dequantize(self.data, self.tensor_type).reshape(self.shape)
        # F32 tensors come back as read-only views of the memory-mapped file; torch wants writable memory.
        return np.require(values, np.float32, ["C_CONTIGUOUS", "WRITEABLE"])


def iter_raw_tensors(gguf: GGUFFile, config: dict[str, Any]) -> Iterator[RawTensor]:
    """Yield every GGUF tensor transformers would load, in HF names and layout, without dequantizing it.

    Rows that llama.cpp reordered (Llama's q and k) are put back in HF order: a row holds whole blocks, so
    this moves bytes without decoding them. Values that differ from HF's (Gemma's norms, stored as 1 + w)
    are decoded, corrected and yielded as F32, the type llama.cpp stores norms in anyway.
    """
    spec = gguf.spec
    for tensor in gguf.tensors:
        name = hf_name(tensor.name, spec)
        if name is None:
            continue
        # GGUF lists dimensions innermost first; torch lists them outermost first.
        shape = tuple(int(n) for n in reversed(tensor.shape))
        # The reader gives float tensors as floats and quantized ones as bytes; one byte view serves both.
        raw = RawTensor(name, _rows(tensor.data.view(np.uint8), shape), tensor.tensor_type, shape)
        if spec.norm_offset and tensor.name.endswith("norm.weight"):
            raw = _as_f32(raw, raw.dequantize() - np.float32(spec.norm_offset))
        yield raw._replace(data=_hf_row_order(tensor.name, raw.data, spec, config))


def iter_hf_tensors(gguf: GGUFFile, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (HF name, float32 array) for every GGUF tensor transformers would load."""
    for raw in iter_raw_tensors(gguf, config):
        yield raw.name, raw.dequantize()


def _rows(data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return data.reshape(*shape[:-1], -1)  # [*shape[:-1], bytes per row]


def _as_f32(raw: RawTensor, values: np.ndarray) -> RawTensor:
    data = _rows(values.astype(np.float32, copy=False).view(np.uint8), raw.shape)
    return raw._replace(data=data, tensor_type=GGMLQuantizationType.F32)


def _hf_row_order(gguf_name: str, rows: np.ndarray, spec: ArchSpec, config: dict[str, Any]) -> np.ndarray:
    if spec.permute_qk and gguf_name.endswith("attn_q.weight"):
        return unpermute_qk(rows, config["num_attention_heads"])
    if spec.permute_qk and gguf_name.endswith("attn_k.weight"):
        return unpermute_qk(rows, config["num_key_value_heads"])
    return rows


def hf_config(gguf: GGUFFile) -> dict[str, Any]:
    """config.json for the model in `gguf`, with the values transformers derives from the same file."""
    spec, meta = gguf.spec, gguf.metadata
    num_heads = gguf.arch_value("attention.head_count")
    hidden_size = gguf.arch_value("embedding_length")
    config = {
        "architectures": [spec.hf_architecture],
        "model_type": spec.model_type,
        "hidden_size": hidden_size,
        "intermediate_size": gguf.arch_value("feed_forward_length"),
        "num_hidden_layers": gguf.arch_value("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": gguf.arch_value("attention.head_count_kv", num_heads),
        "head_dim": _head_dim(gguf, hidden_size // num_heads),
        "rms_norm_eps": gguf.arch_value("attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": gguf.arch_value("context_length"),
        "vocab_size": gguf.arch_value("vocab_size", len(meta["tokenizer.ggml.tokens"])),
        "rope_theta": gguf.arch_value("rope.freq_base", 10000.0),
        spec.hidden_act_key: spec.hidden_act,
        # llama.cpp writes `output.weight` only when the head is not the embedding matrix.
        "tie_word_embeddings": all(t.name != "output.weight" for t in gguf.tensors),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "unk_token_id": meta.get("tokenizer.ggml.unknown_token_id"),
        "torch_dtype": "float32",
    }
    if gguf.architecture == "gemma3":
        config |= _gemma3_extras(gguf, config)
    else:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    return config


def _head_dim(gguf: GGUFFile, default: int) -> int:
    # llama writes the rotary width; the others write the key width. Both equal head_dim here.
    key = "rope.dimension_count" if gguf.architecture == "llama" else "attention.key_length"
    return gguf.arch_value(key, default)


# Gemma 3 alternates 5 sliding-window layers with 1 global layer; llama.cpp hard-codes the same.
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0


def _gemma3_extras(gguf: GGUFFile, config: dict[str, Any]) -> dict[str, Any]:
    num_layers = config["num_hidden_layers"]
    layer_types = [
        "full_attention" if (i + 1) % GEMMA3_SLIDING_PATTERN == 0 else "sliding_attention" for i in range(num_layers)
    ]
    full_rope = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    if gguf.arch_value("rope.scaling.type") == "linear":
        full_rope |= {"rope_type": "linear", "factor": float(gguf.arch_value("rope.scaling.factor"))}
    return {
        "sliding_window": gguf.arch_value("attention.sliding_window", 4096),
        "layer_types": layer_types,
        # Gemma 3 scales queries by 1/sqrt(head_dim) for every size but 27B, and GGUF does not say which.
        "query_pre_attn_scalar": config["head_dim"],
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_THETA,
        "rope_parameters": {
            "full_attention": full_rope,
            "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_ROPE_THETA},
        },
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "attention_bias": False,
    }


# --- tokenizer.json from the GGUF vocabulary, as transformers' GGUF tokenizer converter builds it ---

_CONTROL, _USER_DEFINED = 3, 4
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> the split regex the BPE merges were learned with.
_PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# Tokens that end a chat turn; they stop generation like EOS does (HF generation_config.json lists them).
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>")


def build_tokenizer(gguf: GGUFFile) -> Tokenizer:
    """The `tokenizers` tokenizer the GGUF vocabulary describes, with BOS/EOS added as its metadata says."""
    meta = gguf.metadata
    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama":
        tokenizer = _sentencepiece_bpe(meta, gemma=gguf.architecture.startswith("gemma"))
    elif kind == "gpt2":
        tokenizer = _byte_level_bpe(meta)
    else:
        raise ValueError(f"{gguf.path}: tokenizer.ggml.model {kind!r} is not supported; supported: 'llama', 'gpt2'")
    _add_special_tokens(tokenizer, meta, byte_level=kind == "gpt2")
    tokenizer.post_processor = _post_processor(meta)
    return tokenizer


def tokenizer_config(gguf: GGUFFile) -> dict[str, Any]:
    """tokenizer_config.json: special token strings, BOS/EOS flags and the chat template."""
    meta, tokens = gguf.metadata, gguf.metadata["tokenizer.ggml.tokens"]
    config: dict[str, Any] = {
        "add_bos_token": _adds_bos(meta),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        config[f"{name}_token"] = tokens[token_id] if token_id is not None else None
    return config


def generation_eos_ids(gguf: GGUFFile) -> list[int]:
    """EOS plus the end-of-turn tokens the vocabulary marks as control tokens."""
    meta = gguf.metadata
    ids = [meta["tokenizer.ggml.eos_token_id"]] if "tokenizer.ggml.eos_token_id" in meta else []
    ids += [meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in meta]
    for token_id, (token, token_type) in enumerate(zip(meta["tokenizer.ggml.tokens"], _token_types(meta))):
        if token in END_OF_TURN_TOKENS and token_type == _CONTROL:
            ids.append(token_id)
    return list(dict.fromkeys(ids))


def _token_types(meta: dict[str, Any]) -> list[int]:
    return meta.get("tokenizer.ggml.token_type") or [1] * len(meta["tokenizer.ggml.tokens"])


def _adds_bos(meta: dict[str, Any]) -> bool:
    # llama.cpp adds BOS to a sentencepiece vocabulary unless the file says otherwise.
    return bool(meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama"))


def _sentencepiece_bpe(meta: dict[str, Any], gemma: bool) -> Tokenizer:
    tokens = list(meta["tokenizer.ggml.tokens"])
    if gemma:
        # Gemma files store tokens of 2+ spaces as real spaces; the model looks them up as "▁▁".
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: index for index, token in enumerate(tokens)}
    if "tokenizer.ggml.merges" in meta:
        merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    else:
        # Gemma's scores do not follow its merge order; the order of tokens in the file does.
        scores = {t: -i for i, t in enumerate(tokens)} if gemma else dict(zip(tokens, meta["tokenizer.ggml.scores"]))
        merges = _merges_from_scores(vocab, scores)
    unk = meta["tokenizer.ggml.tokens"][meta.get("tokenizer.ggml.unknown_token_id", 0)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token=unk, byte_fallback=True))
    decode_steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tokenizer.normalizer = normalizers.Replace(" ", "▁")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    else:
        prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        scheme = "first" if prefix else "never"
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
        decode_steps += [decoders.Strip(content=" ", left=1)] if prefix else []
    tokenizer.decoder = decoders.Sequence(decode_steps)
    return tokenizer


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Every split of a token into two vocabulary pieces, best-scored token first (transformers' order)."""
    merges = []
    for token, score in scores.items():
        local = [(token[:i], token[i:], score) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _byte_level_bpe(meta: dict[str, Any]) -> Tokenizer:
    vocab = {token: index for index, token in enumerate(meta["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    split = _PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _add_special_tokens(tokenizer: Tokenizer, meta: dict[str, Any], byte_level: bool) -> None:
    """Control tokens become special added tokens, user-defined ones plain added tokens (kept whole)."""
    alphabet = set(pre_tokenizers.ByteLevel.alphabet()) if byte_level else None
    tokens, vocab = meta["tokenizer.ggml.tokens"], tokenizer.get_vocab()
    control, user_defined = [], []
    for token, token_type in zip(tokens, _token_types(meta)):
        # In a byte-level vocabulary a control token outside the byte alphabet is a llama.cpp mislabel.
        if token_type == _CONTROL and (alphabet is None or set(token) <= alphabet):
            control.append(AddedToken(token, normalized=False, special=True))
        elif token_type == _USER_DEFINED and token in vocab:
            user_defined.append(AddedToken(token, normalized=False, special=False))
    tokenizer.add_special_tokens(control)
    tokenizer.add_tokens(user_defined)


def _post_processor(meta: dict[str, Any]) -> processors.TemplateProcessing:
    tokens = meta["tokenizer.ggml.tokens"]
    single, pair, specials = "$A:0", "$B:1", []
    if _adds_bos(meta) and "tokenizer.ggml.bos_token_id" in meta:
        bos_id = meta["tokenizer.ggml.bos_token_id"]
        single, pair = f"{tokens[bos_id]}:0 {single}", f"{tokens[bos_id]}:1 {pair}"
        specials.append((tokens[bos_id], bos_id))
    if meta.get("tokenizer.ggml.add_eos_token") and "tokenizer.ggml.eos_token_id" in meta:
        eos_id = meta["tokenizer.ggml.eos_token_id"]
        single, pair = f"{single} {tokens[eos_id]}:0", f"{pair} {tokens[eos_id]}:1"
        specials.append((tokens[eos_id], eos_id))
    return processors.TemplateProcessing(single=single, pair=f"{single} {pair}", special_tokens=specials)
