"""SamplingParams accepts vLLM's ranges and rejects wrong types and values with a message naming the field."""
from __future__ import annotations

import math

import pytest

from jido.core.sampling_params import SamplingParams

INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("kwargs, message", [
    ({"stop": 5}, r"stop must be non-empty strings \(a string or a list of strings\), got 5"),
    ({"stop": True}, "stop must be non-empty strings .*, got True"),
    ({"stop": {"a": 1}}, r"stop must be non-empty strings .*, got \{'a': 1\}"),
    ({"stop": ["a", 1]}, r"stop must be non-empty strings .*, got \['a', 1\]"),
    ({"stop_token_ids": [1, True]}, "stop_token_ids must be a list of non-negative integers that fit in an int64"),
    ({"stop_token_ids": 7}, "stop_token_ids must be a list of non-negative integers"),
    ({"n": True}, "n must be an integer >= 1 that fits in an int64, got True"),
    ({"n": 2.0}, "n must be an integer >= 1 that fits in an int64, got 2.0"),
    ({"temperature": "hot"}, "temperature must be >= 0 .*, got 'hot'"),
    ({"top_p": None}, r"top_p must be in \(0, 1\], got None"),
    ({"top_k": 1.5}, "top_k must be -1, 0 \\(disabled\\) or a positive integer that fits in an int64, got 1.5"),
    ({"ignore_eos": 1}, "ignore_eos must be true or false, got 1"),
    ({"skip_special_tokens": "no"}, "skip_special_tokens must be true or false, got 'no'"),
    ({"include_stop_str_in_output": None}, "include_stop_str_in_output must be true or false, got None"),
])
def test_wrong_types_raise_naming_the_field_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": math.inf}, r"temperature must be >= 0 \(0 means greedy\) and finite .*, got inf"),
    ({"temperature": 1e39}, r"and finite \(at most 3.403e\+38, the largest float32\), got 1e\+39"),
    ({"temperature": math.nan}, "temperature must be >= 0 .*, got nan"),
    ({"top_p": math.nan}, r"top_p must be in \(0, 1\], got nan"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
    ({"min_p": 1.5}, r"min_p must be in \[0, 1\], got 1.5"),
    ({"min_p": math.nan}, r"min_p must be in \[0, 1\], got nan"),
    ({"repetition_penalty": 0.0}, r"repetition_penalty must be > 0 \(1 disables it\) and finite"),
    ({"repetition_penalty": math.inf}, "repetition_penalty must be > 0 .*, got inf"),
    ({"presence_penalty": -2.5}, r"presence_penalty must be in \[-2, 2\], got -2.5"),
    ({"frequency_penalty": math.inf}, r"frequency_penalty must be in \[-2, 2\], got inf"),
    ({"top_k": -2}, "top_k must be -1, 0 \\(disabled\\) or a positive integer"),
    ({"seed": INT64_MAX + 1}, "seed must be an integer that fits in an int64, got 9223372036854775808"),
    ({"seed": -(2**63) - 1}, "seed must be an integer that fits in an int64"),
    ({"seed": 10**5000}, "seed must be an integer that fits in an int64, got an integer of 16610 bits"),
    ({"max_tokens": 2**64}, r"max_tokens must be an integer >= 1 \(0 only with prompt_logprobs\) that fits in an "
                            "int64, got an integer of 65 bits"),
    ({"max_tokens": 0}, r"max_tokens must be an integer >= 1 \(0 only with prompt_logprobs\) .*, got 0"),
    ({"max_tokens": -1, "prompt_logprobs": 1}, "max_tokens must be an integer >= 0 that fits in an int64, got -1"),
    ({"prompt_logprobs": 21}, r"prompt_logprobs must be an integer in \[0, 20\], got 21"),
    ({"prompt_logprobs": True}, r"prompt_logprobs must be an integer in \[0, 20\], got True"),
    ({"min_tokens": 2**64, "max_tokens": None}, "min_tokens must be an integer >= 0 that fits in an int64"),
    ({"stop_token_ids": [2**64]}, "stop_token_ids must .*, got a list holding an integer of more than 64 bits"),
    ({"stop_token_ids": [-1]}, r"stop_token_ids must be a list of non-negative integers .*, got \[-1\]"),
    ({"temperature": 10**400}, "temperature must be >= 0 .*, got an integer of 1329 bits"),
])
def test_out_of_range_values_raise_naming_the_field_and_the_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_the_edges_of_each_range_are_accepted():
    params = SamplingParams(temperature=3.4e38, top_p=1e-300, top_k=-1, min_p=1.0, repetition_penalty=1e-300,
                            presence_penalty=-2, frequency_penalty=2, seed=-(2**63), max_tokens=INT64_MAX,
                            stop=("a", "b"), stop_token_ids=(0, INT64_MAX))
    assert params.stop_strings == ("a", "b")
    assert params.stop_token_ids == [0, INT64_MAX]
    assert SamplingParams(seed=INT64_MAX, temperature=0).is_greedy


def test_an_error_message_stays_short_for_a_long_bad_value():
    with pytest.raises(ValueError) as raised:
        SamplingParams(stop=[""] * 10_000)
    assert len(str(raised.value)) < 200
    assert str(raised.value).endswith("...")


def test_max_tokens_zero_is_taken_when_the_prompt_logprobs_are_asked_for():
    params = SamplingParams(max_tokens=0, prompt_logprobs=0)
    assert (params.max_tokens, params.prompt_logprobs) == (0, 0)
    assert SamplingParams(max_tokens=0, prompt_logprobs=20).prompt_logprobs == 20
