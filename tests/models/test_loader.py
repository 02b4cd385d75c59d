"""GGUF -> HF checkpoint folder (metadata only: weights read from the GGUF), the folder cache, and the errors for
paths that are not models."""

from __future__ import annotations

import json
from pathlib import Path

import gguf as gguf_lib
import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tiny_gguf import llama_cpp_permute, write_and_close

from jido.models import gguf, named
from jido.models.loader import generation_eos_ids, iter_weights, load_config, resolve_model
from jido.models.tokenizer import Tokenizer

# --- the default model: Gemma 3 270M Q4_K_M ---


@pytest.fixture(scope="module")
def gemma_gguf() -> gguf.GGUFFile:
    """The default model's tensor table (jido's index, checked against gguf-py's reader on a small file below:
    gguf-py's own reader takes seconds over the 262k-token vocabulary)."""
    return gguf.open_gguf_index(named.assemble(named.NAMED_MODELS[named.DEFAULT_MODEL], named.cache_root()))


def _stored_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    return {name: tuple(tensor.shape) for name, tensor in iter_weights(folder)}


def test_names_and_shapes_match_transformers_gemma3(gemma_folder: Path) -> None:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig.from_pretrained(gemma_folder)
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Gemma3ForCausalLM(config).state_dict().items()}
    del expected["lm_head.weight"]  # tied to the embedding, so not stored twice
    assert _stored_shapes(gemma_folder) == expected


def test_config_has_the_values_transformers_derives(gemma_folder: Path) -> None:
    config = load_config(gemma_folder)
    expected = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 640,
        "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512, "vocab_size": 262144,
        "max_position_embeddings": 32768, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
        "rms_norm_eps": float(np.float32(1e-6)),
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }
    assert {k: config[k] for k in expected} == expected
    assert config["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert generation_eos_ids(gemma_folder) == [1, 106]


def test_dequantized_values_equal_gguf_dequantize(gemma_folder: Path, gemma_gguf: gguf.GGUFFile) -> None:
    first_of_type = {}
    for tensor in gemma_gguf.tensors:
        if not tensor.name.endswith("norm.weight"):
            first_of_type.setdefault(tensor.tensor_type.name, tensor)
    assert sorted(first_of_type) == ["Q4_K", "Q5_0", "Q6_K", "Q8_0"]  # every F32 tensor is a norm
    wanted = {gguf.hf_name(tensor.name, gemma_gguf.spec): tensor for tensor in first_of_type.values()}
    for name, stored in iter_weights(gemma_folder):
        if name in wanted:
            tensor = wanted.pop(name)
            # A slice of whole rows: gguf-py's own decoder, independently of jido's.
            rows = tensor.data.reshape(int(np.prod(tensor.shape[1:])), -1)[:64]
            expected = gguf_lib.quants.dequantize(rows, tensor.tensor_type)
            assert torch.equal(stored[:64], torch.from_numpy(expected.reshape(len(rows), -1))), name
    assert not wanted


def test_gemma_norms_are_stored_without_the_plus_one(gemma_folder: Path, gemma_gguf: gguf.GGUFFile) -> None:
    norms = [t for t in gemma_gguf.tensors if t.name.endswith("norm.weight")]
    assert len(norms) == 18 * 6 + 1
    stored = {name: t for name, t in iter_weights(gemma_folder) if name.endswith("norm.weight")}
    for tensor in norms:
        expected = tensor.data.view(np.float32) - np.float32(1.0)
        assert torch.equal(stored[gguf.hf_name(tensor.name, gemma_gguf.spec)], torch.from_numpy(expected))


def test_a_gguf_models_folder_holds_no_copy_of_its_weights(gemma_folder: Path) -> None:
    files = sorted(p.name for p in gemma_folder.iterdir())
    assert files == ["config.json", "generation_config.json", "jido_gguf_source.json", "tokenizer.json",
                     "tokenizer_config.json"]


def test_raw_tensors_hand_the_quantized_bytes_through_without_a_copy(gemma_gguf: gguf.GGUFFile,
                                                                    gemma_folder: Path) -> None:
    by_name = {gguf.hf_name(t.name, gemma_gguf.spec): t for t in gemma_gguf.tensors}
    types = set()
    for raw in gguf.iter_raw_tensors(gemma_gguf, load_config(gemma_folder)):
        if raw.name.endswith("norm.weight"):
            continue  # decoded to drop llama.cpp's + 1 (tests/models/test_gguf_raw.py)
        tensor = by_name[raw.name]
        assert raw.tensor_type == tensor.tensor_type and np.shares_memory(raw.data, tensor.data), raw.name
        types.add(raw.tensor_type.name)
    assert sorted(types) == ["Q4_K", "Q5_0", "Q6_K", "Q8_0"]


def test_second_resolve_reuses_the_converted_folder(gemma_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def redone(*args: object) -> None:
        raise AssertionError("a second resolve redid work the first one cached")

    # Neither the GGUF's assembly (a sha256 over 250 MB) nor its conversion may run again.
    monkeypatch.setattr(named, "_concatenate", redone)
    monkeypatch.setattr("jido.models.loader.convert_gguf", redone)
    mtimes = {p.name: p.stat().st_mtime_ns for p in gemma_folder.iterdir()}
    assert resolve_model(None) == gemma_folder
    assert {p.name: p.stat().st_mtime_ns for p in gemma_folder.iterdir()} == mtimes


# --- a tiny llama GGUF written here from known HF weights ---

HIDDEN, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, FFN = 8, 2, 1, 4, 16
TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "a", "b", "▁a", "ab"]


def _tiny_llama_weights() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = {
        "model.embed_tokens.weight": (len(TOKENS), HIDDEN), "lm_head.weight": (len(TOKENS), HIDDEN),
        "model.norm.weight": (HIDDEN,), "model.layers.0.input_layernorm.weight": (HIDDEN,),
        "model.layers.0.post_attention_layernorm.weight": (HIDDEN,),
        "model.layers.0.self_attn.q_proj.weight": (NUM_HEADS * HEAD_DIM, HIDDEN),
        "model.layers.0.self_attn.k_proj.weight": (NUM_KV_HEADS * HEAD_DIM, HIDDEN),
        "model.layers.0.self_attn.v_proj.weight": (NUM_KV_HEADS * HEAD_DIM, HIDDEN),
        "model.layers.0.self_attn.o_proj.weight": (HIDDEN, NUM_HEADS * HEAD_DIM),
        "model.layers.0.mlp.gate_proj.weight": (FFN, HIDDEN), "model.layers.0.mlp.up_proj.weight": (FFN, HIDDEN),
        "model.layers.0.mlp.down_proj.weight": (HIDDEN, FFN),
    }
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def _write_tiny_llama(path: Path, weights: dict[str, torch.Tensor]) -> None:
    hf_to_gguf = {hf: name for name in _gguf_names() if (hf := gguf.hf_name(name, gguf.ARCHS["llama"]))}
    writer = gguf_lib.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(NUM_HEADS)
    writer.add_head_count_kv(NUM_KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * 5)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    for hf, w in weights.items():
        array = w.numpy()
        if hf.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, NUM_HEADS)
        elif hf.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, NUM_KV_HEADS)
        writer.add_tensor(hf_to_gguf[hf], array)
    write_and_close(writer)


def _gguf_names() -> list[str]:
    block = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
    return ["token_embd.weight", "output.weight", "output_norm.weight"] + [f"blk.0.{b}.weight" for b in block]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    weights = _tiny_llama_weights()
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    _write_tiny_llama(path, weights)
    return path, weights


def test_llama_gguf_converts_back_to_the_hf_weights(tiny_llama, tmp_path: Path) -> None:
    path, weights = tiny_llama
    folder = resolve_model(str(path), cache_dir=tmp_path)
    assert folder.parent == tmp_path and folder.name.startswith("tiny-llama-")
    stored = dict(iter_weights(folder))
    assert stored.keys() == weights.keys()
    for name, w in weights.items():
        assert torch.equal(stored[name], w), name
    config = load_config(folder)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is False
    assert (config["head_dim"], config["num_key_value_heads"], config["vocab_size"]) == (HEAD_DIM, 1, len(TOKENS))


def test_a_float_checkpoint_for_a_peer_holds_the_hf_weights_and_the_same_config(tiny_llama, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from jido.models.loader import write_float_checkpoint

    path, weights = tiny_llama
    write_float_checkpoint(path, tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert stored.keys() == weights.keys() and all(torch.equal(stored[n], w) for n, w in weights.items())
    assert load_config(tmp_path) == load_config(resolve_model(str(path), cache_dir=tmp_path / "cache"))


def test_llama_names_and_shapes_match_transformers(tiny_llama, tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = resolve_model(str(tiny_llama[0]), cache_dir=tmp_path)
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig.from_pretrained(folder))
    assert _stored_shapes(folder) == {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_unpermute_matches_transformers_gguf_loader() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    w = np.random.default_rng(0).standard_normal((32, 6)).astype(np.float32)
    reference = LlamaTensorProcessor()._reverse_permute_weights(w, 4, 2)
    assert np.array_equal(gguf.unpermute_qk(w, 2), reference)


def test_a_conversion_removes_the_same_files_folders_from_earlier_versions(tiny_llama, tmp_path: Path) -> None:
    folder = resolve_model(str(tiny_llama[0]), cache_dir=tmp_path / "first")
    stem = folder.name.rsplit("-v", 1)[0]
    cache = tmp_path / "cache"
    old, other = cache / f"{stem}-v2", cache / "another-model-0123456789ab-v2"
    for stale in (old, other):
        stale.mkdir(parents=True)
        (stale / "model.safetensors").write_bytes(b"float32 weights")
    assert resolve_model(str(tiny_llama[0]), cache_dir=cache).name == folder.name
    assert not old.exists() and other.exists()  # another model's folder is not this conversion's to remove


def test_sentencepiece_tokenizer_adds_prefix_space_and_bos(tiny_llama, tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_folder(resolve_model(str(tiny_llama[0]), cache_dir=tmp_path))
    ids = tokenizer.encode("a ab")
    assert tokenizer.convert_ids_to_tokens(ids) == ["<s>", "▁a", "▁a", "b"]  # "▁a" outranks "ab"
    assert tokenizer.decode(ids) == "a ab"
    assert tokenizer.encode("é", add_special_tokens=False) == [TOKENS.index("▁"), 3 + 0xC3, 3 + 0xA9]


def test_cache_dir_comes_from_the_environment(tiny_llama, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("JIDO_CACHE_DIR", str(tmp_path / "env-cache"))
    assert resolve_model(str(tiny_llama[0])).parent == tmp_path / "env-cache"


def test_failed_conversion_leaves_no_folder_behind(tiny_llama, tmp_path: Path, monkeypatch) -> None:
    def crash(_):
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(gguf, "build_tokenizer", crash)
    with pytest.raises(RuntimeError, match="mid-conversion"):
        resolve_model(str(tiny_llama[0]), cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert (resolve_model(str(tiny_llama[0]), cache_dir=tmp_path) / "config.json").is_file()


def test_a_gguf_cut_short_is_refused_as_such_and_leaves_no_folder_behind(tiny_llama, tmp_path: Path) -> None:
    whole = tiny_llama[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:len(whole) - 100])
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"cut\.gguf: not a readable GGUF file, cut short or corrupt"):
        resolve_model(str(cut), cache_dir=cache)
    assert not cache.exists() or list(cache.iterdir()) == []


# --- HF folders and bad paths ---


def test_hf_folder_is_returned_as_is_and_shards_are_read(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    save_file({"a.weight": torch.ones(2)}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"b.weight": torch.zeros(3)}, tmp_path / "model-00002-of-00002.safetensors")
    index = {"weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                            "b.weight": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert resolve_model(str(tmp_path)) == tmp_path
    assert [(name, t.tolist()) for name, t in iter_weights(tmp_path)] == [("a.weight", [1.0, 1.0]),
                                                                          ("b.weight", [0.0, 0.0, 0.0])]
    assert generation_eos_ids(tmp_path) == [7]


def test_missing_path_says_what_is_accepted(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no-such\.gguf': no such file or folder; expected a \.gguf file"):
        resolve_model(str(tmp_path / "no-such.gguf"))


def test_file_that_is_not_gguf_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ValueError, match="is a file but not a GGUF file"):
        resolve_model(str(path))


def test_folder_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="has no config.json"):
        resolve_model(str(tmp_path))


def test_folder_without_weights_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"no \*\.safetensors weights"):
        resolve_model(str(tmp_path))


def test_the_tensor_index_reads_what_gguf_py_reads_without_the_vocabulary(tiny_llama) -> None:
    from gguf import GGUFReader

    path = tiny_llama[0]
    index, reader = gguf.open_gguf_index(path), GGUFReader(path)
    assert [t.name for t in index.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(index.tensors, reader.tensors):
        assert ours.shape == tuple(int(n) for n in theirs.shape) and ours.tensor_type == theirs.tensor_type
        assert np.array_equal(ours.data, theirs.data.view(np.uint8).reshape(-1)), ours.name
    assert index.architecture == "llama" and index.metadata["llama.block_count"] == reader.fields["llama.block_count"].contents()
    assert index.metadata["tokenizer.ggml.tokens"] is None  # arrays are walked over, not read


def test_the_tensor_index_refuses_a_file_cut_short_by_name(tiny_llama, tmp_path: Path) -> None:
    whole = tiny_llama[0].read_bytes()
    vocabulary = whole.index(b"tokenizer.ggml.tokens") + 40  # a few strings into the vocabulary, which is stepped over
    for keep in (len(whole) - 100, 40, vocabulary):  # inside the last tensor's bytes, the metadata, the vocabulary
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(whole[:keep])
        with pytest.raises(ValueError, match=r"cut\.gguf: not a readable GGUF file, cut short or corrupt"):
            gguf.open_gguf_index(cut)
