"""Qwen2.5-Coder-0.5B-Instruct on real weights: jido's tokenizer, EOS ids and greedy tokens equal transformers'."""
from __future__ import annotations

import pytest
from near_tie import NEAR_TIE_LOGIT_GAP, assert_same_until_a_near_tie

from jido import SamplingParams
from jido.engine.chat_template import load_chat_template
from jido.models.loader import generation_eos_ids, load_config
from jido.models.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

IM_END, ENDOFTEXT = 151645, 151643


def test_tokenizer_ids_and_text_match_transformers(qwen_llm, qwen_reference):
    tokenizer = qwen_llm.get_tokenizer()
    for case in qwen_reference["tokenizer_cases"]:
        assert tokenizer.encode(case["text"]) == case["ids"], case["text"]
        assert tokenizer.convert_ids_to_tokens(case["ids"]) == case["tokens"], case["text"]
        assert tokenizer.decode(case["ids"]) == case["decoded"], case["text"]
        assert tokenizer.decode(case["ids"], skip_special_tokens=False) == case["decoded_with_special"], case["text"]
    for gen in qwen_reference["generations"][:3]:  # plain text; the chat prompts' ids come from the template
        assert tokenizer.encode(gen["prompt"]) == gen["prompt_ids"], gen["name"]


def test_generation_stops_at_the_ggufs_end_of_turn_and_end_of_text(qwen_folder, qwen_llm, qwen_reference):
    assert generation_eos_ids(qwen_folder) == [IM_END, ENDOFTEXT]
    assert qwen_llm.get_tokenizer().convert_ids_to_tokens([IM_END, ENDOFTEXT]) == ["<|im_end|>", "<|endoftext|>"]
    chat = next(g for g in qwen_reference["generations"] if g["name"] == "chat_tools")
    assert IM_END in chat["output_ids"]  # transformers' answer (a tool call) ends its turn within the fixture
    out = qwen_llm.generate([chat["prompt_ids"]], SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    completion = out[0].outputs[0]
    assert completion.finish_reason == "stop" and completion.token_ids[-1] == IM_END
    assert completion.token_ids == chat["output_ids"][: chat["output_ids"].index(IM_END) + 1]


def test_batched_greedy_tokens_match_transformers(qwen_llm, qwen_reference):
    # Plain prompts and chat prompts (system, tools) rendered by transformers, in one batch.
    gens = qwen_reference["generations"]
    assert {g["name"] for g in gens} >= {"code", "chat_user_only", "chat_system", "chat_tools"}
    params = SamplingParams(temperature=0, max_tokens=max(len(g["output_ids"]) for g in gens), ignore_eos=True)
    outputs = qwen_llm.generate([g["prompt_ids"] for g in gens], params, use_tqdm=False)
    for gen, out in zip(gens, outputs):
        assert_same_until_a_near_tie(gen["name"], out.outputs[0].token_ids[: len(gen["output_ids"])], gen,
                                     NEAR_TIE_LOGIT_GAP)


def test_the_1_5b_target_shares_the_tokenizer_template_and_eos_and_has_2_kv_heads(qwen_1_5b_folder, qwen_reference):
    # The draft/target pair for speculative decoding must agree on every token id.
    config = load_config(qwen_1_5b_folder)
    assert [config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads")] == [
        28, 1536, 12, 2]
    tokenizer = Tokenizer.from_folder(qwen_1_5b_folder)
    for case in qwen_reference["tokenizer_cases"]:
        assert tokenizer.encode(case["text"]) == case["ids"], case["text"]
    template = load_chat_template(tokenizer)
    # Its GGUF's template differs from the 0.5B's only inside the tools block (it prints the call format's
    # braces doubled), so the renders without tools must be the 0.5B's, which transformers made.
    for case in qwen_reference["chat_cases"]:
        if "tools" not in case:
            assert template.render(case["messages"]) == case["text"], case["name"]
    assert generation_eos_ids(qwen_1_5b_folder) == [IM_END, ENDOFTEXT]
