"""The Gemma 3 tokenizer built from GGUF metadata gives transformers' ids and text; info() is its settings as vLLM's /tokenizer_info gives them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jido.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(gemma_folder: Path) -> Tokenizer:
    return Tokenizer.from_folder(gemma_folder)


def test_ids_equal_transformers_ids(tokenizer: Tokenizer, gemma_reference: dict) -> None:
    for case in gemma_reference["tokenizer_cases"]:
        assert tokenizer.encode(case["text"]) == case["ids"], case["text"]
        assert tokenizer.encode(case["text"], add_special_tokens=False) == case["ids_no_special"], case["text"]
        assert tokenizer.convert_ids_to_tokens(case["ids"]) == case["tokens"], case["text"]


def test_prompt_ids_equal_transformers_ids(tokenizer: Tokenizer, gemma_reference: dict) -> None:
    for run in gemma_reference["generations"]:
        assert tokenizer.encode(run["prompt"]) == run["prompt_ids"], run["name"]


def test_decode_equals_transformers_decode(tokenizer: Tokenizer, gemma_reference: dict) -> None:
    for case in gemma_reference["tokenizer_cases"]:
        assert tokenizer.decode(case["ids"]) == case["decoded"], case["text"]
        assert tokenizer.decode(case["ids"], skip_special_tokens=False) == case["decoded_with_special"], case["text"]
    for run in gemma_reference["generations"]:
        assert tokenizer.decode(run["output_ids"]) == run["text"], run["name"]


def test_decode_round_trips_text(tokenizer: Tokenizer, gemma_reference: dict) -> None:
    for case in gemma_reference["tokenizer_cases"]:
        if "<start_of_turn>" not in case["text"]:  # special tokens are dropped on decode
            assert tokenizer.decode(tokenizer.encode(case["text"])) == case["text"]


def test_bytes_outside_the_vocabulary_use_byte_fallback(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("\x00", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids) == ["<0x00>"]


def test_turn_markers_are_single_special_tokens(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<start_of_turn>user\nhi<end_of_turn>", add_special_tokens=False)
    assert ids == [105, 2364, 107, 2202, 106]
    assert {105, 106} <= tokenizer.all_special_ids


def test_special_ids_follow_gguf_metadata(tokenizer: Tokenizer) -> None:
    assert tokenizer.bos_token_id == 2
    assert tokenizer.eos_token_ids == [1, 106]  # <eos> and <end_of_turn>
    assert tokenizer.pad_token_id == 0
    assert tokenizer.vocab_size == 262144
    assert tokenizer.chat_template is None
    assert {0, 1, 2, 3, 4} <= tokenizer.all_special_ids
    assert 107 not in tokenizer.all_special_ids  # "\n" is a user-defined token, not a special one


def test_folder_without_tokenizer_json_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        Tokenizer.from_folder(tmp_path)


def test_info_gives_the_special_tokens_transformers_gives(tokenizer: Tokenizer, gemma_folder: Path) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(gemma_folder)
    info = tokenizer.info()
    assert {key: info[key] for key in ("bos_token", "eos_token", "pad_token", "unk_token")} == {
        "bos_token": reference.bos_token, "eos_token": reference.eos_token, "pad_token": reference.pad_token,
        "unk_token": reference.unk_token}
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_info_is_the_tokenizer_config_with_added_tokens_as_text_and_no_file_paths(tmp_path: Path,
                                                                                 tiny_model_folder: Path) -> None:
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_bytes((tiny_model_folder / name).read_bytes())
    added = {"content": "<eos>", "lstrip": False, "rstrip": False, "special": True, "__type": "AddedToken"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": added, "added_tokens_decoder": {"1": added}, "vocab_file": "/home/me/vocab.txt",
        "tokenizer_file": "tokenizer.json", "model_max_length": 256, "tokenizer_class": "GemmaTokenizer"}))
    assert Tokenizer.from_folder(tmp_path).info() == {
        "eos_token": "<eos>", "added_tokens_decoder": {"1": "<eos>"}, "model_max_length": 256,
        "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "pad_token": "<pad>"}


def test_tokenizers_of_one_file_share_one_parse_while_held_and_a_rewritten_file_is_parsed_again(
        tmp_path: Path, tiny_model_folder: Path) -> None:
    import gc

    from jido.models import tokenizer as tokenizer_module

    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_bytes((tiny_model_folder / name).read_bytes())
    first, second = Tokenizer.from_folder(tmp_path), Tokenizer.from_folder(tmp_path)
    assert first._backend is second._backend
    text = "hello world"
    assert first.encode(text) == second.encode(text)

    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    word = "zzqx"
    vocab[word] = max(vocab.values()) + 1  # a vocabulary one token longer: another file
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    rewritten = Tokenizer.from_folder(tmp_path)
    assert rewritten._backend is not first._backend
    assert rewritten.vocab_size == first.vocab_size + 1

    def held() -> set[str]:
        return {key[0] for key in tokenizer_module._BACKENDS.keys()}

    assert str((tmp_path / "tokenizer.json").resolve()) in held()
    del first, second, rewritten
    gc.collect()
    assert str((tmp_path / "tokenizer.json").resolve()) not in held()
