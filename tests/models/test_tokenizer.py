"""The Gemma 3 tokenizer built from GGUF metadata gives transformers' ids and text."""

from __future__ import annotations

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
