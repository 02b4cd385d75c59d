"""Sampling settings, seeds, stop conditions and incremental detokenization on the real model."""
from __future__ import annotations

from jido import SamplingParams


def test_same_seed_gives_same_tokens_batched_or_not(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=16, ignore_eos=True)
    prompts = ["Once upon a time", "The weather today is", "In 1492, Columbus"]
    alone = llm.generate([prompts[0]], params, use_tqdm=False)[0].outputs[0].token_ids
    batched = llm.generate(prompts, params, use_tqdm=False)
    again = llm.generate([prompts[0]], params, use_tqdm=False)[0].outputs[0].token_ids
    assert batched[0].outputs[0].token_ids == alone == again
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=99, max_tokens=16, ignore_eos=True)
    assert llm.generate([prompts[0]], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_n_completions_differ_and_are_reproducible(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    first = llm.generate(["My favourite food is"], params, use_tqdm=False)[0]
    second = llm.generate(["My favourite food is"], params, use_tqdm=False)[0]
    ids = [c.token_ids for c in first.outputs]
    assert [c.index for c in first.outputs] == [0, 1, 2] and len({tuple(i) for i in ids}) > 1
    assert ids == [c.token_ids for c in second.outputs]


def test_stop_string_split_across_tokens_is_found_and_removed(llm):
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    full = llm.generate(["The capital of France is"], greedy, use_tqdm=False)[0].outputs[0]
    assert full.text.startswith(" the capital of the country of France.")
    # "ountry of Fr" starts inside one token and ends inside another.
    stopped = llm.generate(["The capital of France is"],
                           SamplingParams(temperature=0, max_tokens=32, stop=["ountry of Fr"]), use_tqdm=False)[0]
    out = stopped.outputs[0]
    assert out.text == " the capital of the c" and out.finish_reason == "stop" and out.stop_reason == "ountry of Fr"
    assert out.token_ids == full.token_ids[:len(out.token_ids)] and len(out.token_ids) < 32
    kept = llm.generate(["The capital of France is"], SamplingParams(
        temperature=0, max_tokens=32, stop=["France"], include_stop_str_in_output=True), use_tqdm=False)[0]
    assert kept.outputs[0].text == " the capital of the country of France"


def test_stop_token_ids_min_tokens_and_max_tokens(llm):
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    full = llm.generate(["The capital of France is"], greedy, use_tqdm=False)[0].outputs[0].token_ids
    first_new = next(i for i in range(2, len(full)) if full[i] not in full[:i])
    stop_id = full[first_new]
    out = llm.generate(["The capital of France is"], SamplingParams(
        temperature=0, max_tokens=32, stop_token_ids=[stop_id]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == full[:first_new + 1] and out.finish_reason == "stop" and out.stop_reason == stop_id
    out = llm.generate(["The capital of France is"], SamplingParams(
        temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == full[:5] and out.finish_reason == "length"


def test_model_eos_ids_include_gemmas_end_of_turn(llm):
    assert llm.llm_engine.eos_token_ids == (1, 106)  # <eos>, <end_of_turn>


def test_eos_ends_generation_unless_ignored_or_before_min_tokens(llm, monkeypatch):
    # This base model almost never emits <eos> greedily, so make its greedy third token an EOS id for
    # this test: the whole engine path (request EOS ids, stop check, finish reason) is the real one.
    prompt = "The capital of France is"
    full = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].token_ids
    eos = full[2]
    first = full.index(eos)
    monkeypatch.setattr(llm.llm_engine, "eos_token_ids", (1, 106, eos))
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == full[:first + 1] and out.finish_reason == "stop" and out.stop_reason is None
    ignored = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
    assert ignored.token_ids == full and ignored.finish_reason == "length"
    # min_tokens forbids EOS until it is reached, so the sampler picks the next best token instead.
    held = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, min_tokens=first + 2),
                        use_tqdm=False)[0].outputs[0]
    assert eos not in held.token_ids[:first + 2] and held.token_ids[:first] == full[:first]


def test_incremental_text_equals_decoding_all_tokens_for_korean_and_emoji(llm):
    tokenizer = llm.get_tokenizer()
    prompts = ["지도는 세상을 이해하는 방법이다. 대한민국의 수도는", "Reply with emoji only: 🎉🔥", "日本の首都は"]
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True)
    for output in llm.generate(prompts, params, use_tqdm=False):
        completion = output.outputs[0]
        assert completion.text == tokenizer.decode(completion.token_ids)


def test_logprobs_report_the_sampled_token_and_top_n(llm):
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=3, logprobs=5),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 3
    for token_id, entry in zip(out.token_ids, out.logprobs):
        assert entry.sampled_token_id == token_id and entry.top_token_ids[0] == token_id  # greedy = top-1
        assert len(entry.top_logprobs) == 5 and entry.top_logprobs == sorted(entry.top_logprobs, reverse=True)
        assert entry.sampled_logprob <= 0.0
    assert abs(out.cumulative_logprob - sum(e.sampled_logprob for e in out.logprobs)) < 1e-6


def test_penalties_change_a_repetitive_continuation(llm):
    prompt = "one one one one one one one one"
    plain = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0].token_ids
    penalized = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                      repetition_penalty=2.0, frequency_penalty=1.0),
                             use_tqdm=False)[0].outputs[0].token_ids
    one = llm.get_tokenizer().encode(" one", add_special_tokens=False)
    assert plain.count(one[0]) > penalized.count(one[0])
