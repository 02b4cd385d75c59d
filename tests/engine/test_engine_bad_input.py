"""Bad input raises a ValueError that says what was wrong, and the same LLM keeps serving correctly."""
from __future__ import annotations

import pytest

from jido import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def expected(llm) -> list[int]:
    return llm.generate(["The capital of France is"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize("prompt, message", [
    ("", "prompt is empty"),
    ([], "no prompts given"),
    ([[]], "prompt is empty"),
    ([[2, 818, 10**7]], r"token id 10000000 at position 2 is outside the vocabulary: ids must be in \[0, 262144\)"),
    ([[2, -1]], "token id -1 at position 1"),
    ([3.5], "a prompt must be a string or a list of token ids"),
    ([{"text": "x"}], "needs a 'prompt'"),
    (["ok \ud800"], r"prompt is not valid Unicode: character 3 is a lone surrogate \('\\ud800'\)"),
])
def test_bad_prompt_raises_and_engine_keeps_serving(llm, expected, prompt, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt, GREEDY, use_tqdm=False)
    assert llm.generate(["The capital of France is"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == expected


def test_prompt_longer_than_max_model_len_raises_and_loses_nothing(llm, expected):
    too_long = [2] + [818] * llm.llm_engine.max_model_len
    with pytest.raises(ValueError, match=r"prompt has \d+ tokens but max_model_len is \d+"):
        llm.generate(["The capital of France is", too_long], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.generate(["The capital of France is"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == expected


@pytest.mark.parametrize("kwargs, message", [
    ({"max_tokens": 0}, "max_tokens must be an integer >= 1"),
    ({"temperature": -0.5}, r"temperature must be >= 0"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -3}, "top_k must be"),
    ({"stop": [""]}, "stop must be non-empty strings"),
    ({"logprobs": 50}, r"logprobs must be an integer in \[0, 20\]"),
    ({"n": 0}, "n must be an integer >= 1"),
])
def test_bad_sampling_params_raise_with_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_count_must_match_prompts(llm, expected):
    with pytest.raises(ValueError, match="got 2 SamplingParams for 1 prompts"):
        llm.generate(["a"], [GREEDY, GREEDY], use_tqdm=False)
    assert llm.generate(["The capital of France is"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == expected


def test_missing_model_path_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        LLM(model=str(tmp_path / "does-not-exist.gguf"))


def test_a_file_that_is_not_a_model_raises_value_error(tmp_path):
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("hello, I am not a model")
    with pytest.raises(ValueError):
        LLM(model=str(bogus))


@pytest.mark.parametrize("kwargs, message", [
    ({"block_size": 0}, "block_size must be a positive integer"),
    ({"kv_cache_memory": "lots"}, "cannot read size 'lots'"),
    ({"dtype": "float8"}, "dtype must be one of"),
    ({"device": "tpu"}, "device must be 'cpu' or 'cuda"),
    ({"max_model_len": 10**6}, "exceeds the model's limit of 32768"),
    ({"kv_cache_memory": "1MiB", "max_model_len": 4096}, "does not fit in the KV cache"),
    ({"enable_chunked_prefill": False, "max_model_len": 4096},
     "max_model_len=4096 exceeds max_num_batched_tokens=2048: with enable_chunked_prefill off"),
    ({"kv_cache_memory": "64KiB", "dtype": "float32"}, "65536 bytes hold no KV block: one block takes 98304 bytes"),
    ({"kv_cache_memory": "64KiB", "dtype": "bfloat16"},
     "'64KiB' of KV cache holds 1 blocks of 49152 bytes; even a 16-token request needs 6: raise kv_cache_memory"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}, "tensor_parallel_size": 2},
     "speculative_config runs on one rank"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2},
      "kv_transfer_config": {"kv_connector": "tcp", "kv_role": "kv_consumer"}}, "speculative_config and kv_transfer_config"),
])
def test_bad_engine_config_raises(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(**kwargs)


def test_each_prompt_is_validated_and_tokenized_once(llm, monkeypatch):
    engine = llm.llm_engine
    calls = {"encode": 0, "check": 0}
    encode, check = engine.tokenizer.encode, engine._check_token_ids

    def counting_encode(*args, **kwargs):
        calls["encode"] += 1
        return encode(*args, **kwargs)

    def counting_check(ids):
        calls["check"] += 1
        return check(ids)

    monkeypatch.setattr(engine.tokenizer, "encode", counting_encode)
    monkeypatch.setattr(engine, "_check_token_ids", counting_check)
    llm.generate(["The capital of France is", [2, 818, 5279]], SamplingParams(max_tokens=1), use_tqdm=False)
    assert calls == {"encode": 1, "check": 1}
