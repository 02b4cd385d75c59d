"""Structured-output constraints: validation, grammars compiled on the default model's vocabulary, and their masks."""
from __future__ import annotations

import re

import numpy as np
import pytest

from jido.core.sampling_params import StructuredOutputsParams
from jido.core.structured_output import GrammarCompiler, bitmask_words, fill_bitmasks
from jido.models.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # the default model's tokenizer

VOCAB = 262_144


@pytest.fixture(scope="module")
def compiler(gemma_folder) -> GrammarCompiler:
    tokenizer = Tokenizer.from_folder(gemma_folder)
    return GrammarCompiler(gemma_folder / "tokenizer.json", VOCAB, tokenizer.eos_token_ids)


@pytest.fixture(scope="module")
def token_bytes(gemma_folder) -> dict[int, bytes]:
    """Each ordinary token's bytes, read from its SentencePiece piece (▁ a space, <0xHH> one byte)."""
    tokenizer = Tokenizer.from_folder(gemma_folder)
    pieces = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    special = tokenizer.all_special_ids if hasattr(tokenizer, "all_special_ids") else set()
    out = {}
    for token_id, piece in enumerate(pieces):
        if piece is None or token_id in special:
            continue
        out[token_id] = (bytes([int(piece[3:5], 16)]) if re.fullmatch(r"<0x[0-9A-F]{2}>", piece)
                         else piece.replace("\u2581", " ").encode())
    return out


def allowed_tokens(mask: np.ndarray) -> set[int]:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one of json, regex, choice, grammar or json_object, got none"),
    ({"regex": "a+", "choice": ["a"]}, "exactly one of json, regex, choice, grammar or json_object, got regex, choice"),
    ({"choice": []}, "structured_outputs.choice must be a non-empty list of strings"),
    ({"regex": ""}, "structured_outputs.regex must be a non-empty string"),
])
def test_structured_outputs_params_refuse_anything_but_one_constraint(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        StructuredOutputsParams(**kwargs)


@pytest.mark.parametrize("kwargs, field", [
    ({"regex": "(unclosed"}, "structured_outputs.regex"),
    ({"json": "{not json"}, "structured_outputs.json"),
    ({"json": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}, "structured_outputs.json"),
    ({"grammar": "start: undefined_rule"}, "structured_outputs.grammar"),
])
def test_a_bad_constraint_is_a_value_error_naming_its_field(compiler, kwargs, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        compiler.compile(StructuredOutputsParams(**kwargs))


def test_a_choice_mask_allows_exactly_the_tokens_that_spell_a_prefix_of_a_choice(compiler, token_bytes):
    choices = ["red", "green", "blue sky"]
    grammar = compiler.compile(StructuredOutputsParams(choice=choices))
    masks = fill_bitmasks({"r": grammar})["r"]
    assert masks.shape == (1, bitmask_words(VOCAB))  # one row: the next token's
    mask = masks[0]
    expected = {t for t, data in token_bytes.items()
                if data and any(c.encode().startswith(data) for c in choices)}
    assert allowed_tokens(mask) == expected


def test_the_grammar_advances_with_accepted_tokens_and_terminates_when_nothing_can_follow(compiler, gemma_folder,
                                                                                          token_bytes):
    tokenizer = Tokenizer.from_folder(gemma_folder)
    grammar = compiler.compile(StructuredOutputsParams(regex="[0-9]{2,3}"))
    mask = np.empty(bitmask_words(VOCAB), dtype=np.int32)
    digits = tokenizer.encode("123", add_special_tokens=False)
    for token_id in digits[:2]:
        assert grammar.accept_token(token_id) and not grammar.is_terminated()
    grammar.fill_bitmask(mask)
    digit_ids = {t for t, data in token_bytes.items() if len(data) == 1 and data.isdigit()}  # <0x3N> bytes too
    assert allowed_tokens(mask) == digit_ids | set(tokenizer.eos_token_ids)  # a third digit, or the end
    assert grammar.accept_token(digits[2]) and grammar.is_terminated()  # three digits: nothing may follow
    assert not compiler.compile(StructuredOutputsParams(regex="[0-9]{2,3}")).accept_token(tokenizer.encode(
        "x", add_special_tokens=False)[0])


def test_masks_for_verified_proposals_are_the_masks_after_each_proposal_and_leave_the_grammar_where_it_was(
        compiler, gemma_folder):
    tokenizer = Tokenizer.from_folder(gemma_folder)
    params = StructuredOutputsParams(regex="[a-z]+ [0-9]{2}")
    proposals = tokenizer.encode("cat 42", add_special_tokens=False)
    grammar = compiler.compile(params)
    masks = fill_bitmasks({"r": grammar}, {"r": proposals})["r"]
    assert masks.shape == (1 + len(proposals), bitmask_words(VOCAB))
    reference = compiler.compile(params)  # advanced token by token, one mask at a time
    for j, token_id in enumerate([None, *proposals]):
        if token_id is not None and not reference.is_terminated():
            assert reference.accept_token(token_id)
        expected = np.empty(bitmask_words(VOCAB), dtype=np.int32)
        reference.fill_bitmask(expected)
        assert np.array_equal(masks[j], expected), f"row {j}"
    assert allowed_tokens(masks[-1]) == set(tokenizer.eos_token_ids)  # "cat 42" is complete: only the end
    again = fill_bitmasks({"r": grammar})["r"][0]  # taken back: the next step starts from the same place
    assert np.array_equal(again, masks[0])


def test_proposals_are_cut_at_the_first_token_the_grammar_refuses(compiler, gemma_folder):
    tokenizer = Tokenizer.from_folder(gemma_folder)
    grammar = compiler.compile(StructuredOutputsParams(regex="[a-z]+ [0-9]{2}"))
    valid = tokenizer.encode("cat 4", add_special_tokens=False)
    refused = tokenizer.encode("7", add_special_tokens=False)  # a letter must come first
    assert grammar.validate_tokens(valid + tokenizer.encode("x", add_special_tokens=False) + valid) == len(valid)
    assert grammar.validate_tokens(refused) == 0
    mask = fill_bitmasks({"r": grammar})["r"][0]  # validating advanced nothing
    assert set(valid[:1]) <= allowed_tokens(mask) and not set(refused) & allowed_tokens(mask)


def test_compilers_of_one_vocabulary_share_its_token_trie_and_another_eos_gets_its_own(compiler, gemma_folder):
    schema = StructuredOutputsParams(json={"type": "object"})
    second = GrammarCompiler(gemma_folder / "tokenizer.json", VOCAB, compiler._eos_token_ids)
    other_eos = GrammarCompiler(gemma_folder / "tokenizer.json", VOCAB, [0])
    for each in (compiler, second, other_eos):
        each.compile(schema)
    assert second._llg_tokenizer() is compiler._llg_tokenizer()
    assert other_eos._llg_tokenizer() is not compiler._llg_tokenizer()
