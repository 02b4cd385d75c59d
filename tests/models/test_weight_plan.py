"""The weight plan: which copies quantized layers hold beside their codes, under weights_memory."""
from __future__ import annotations

import pytest
import torch
from test_quantized_linear import mixed_llama_for_engine

from jido.config.model import ModelConfig
from jido.core.sampling_params import SamplingParams
from jido.engine.llm import LLM
from jido.layers import int8_dot
from jido.layers.quantized_layouts import QuantizedLayouts
from jido.layers.weight_plan import (BF16_COPY, CODES, FIVE_BITS, PANELS, LayoutCosts, WeightPlan, choose_extras,
                                     format_table, held_layouts)

MIB = 1 << 20
COSTS = LayoutCosts(100 * MIB, {FIVE_BITS: 30 * MIB, PANELS: 120 * MIB, BF16_COPY: 200 * MIB})


def test_lean_admits_no_copy_and_auto_with_unknown_memory_admits_every_one():
    assert choose_extras("lean", COSTS, 10 << 30)[0] == frozenset()
    assert choose_extras("auto", COSTS, None)[0] == {FIVE_BITS, PANELS, BF16_COPY}


def test_a_size_admits_copies_in_order_of_gain_while_they_fit_beside_the_codes_and_skips_one_too_large():
    # 100 MiB of codes in 300 MiB leaves 200: five-bit rows (30) and panels (120) fit, the bf16 copy (200) does not.
    admitted, reason = choose_extras("300MiB", COSTS, None)
    assert admitted == {FIVE_BITS, PANELS} and "left out bf16_copy (200 MiB)" in reason
    # 250 MiB leaves 150: after the five-bit rows, panels (120) fit exactly.
    assert choose_extras(250 * MIB, COSTS, None)[0] == {FIVE_BITS, PANELS}
    # 140 MiB leaves 40: the five-bit rows only; the panels are left out, and so is the later, larger bf16 copy.
    assert choose_extras("140MiB", COSTS, None)[0] == {FIVE_BITS}


def test_auto_gives_the_copies_the_memory_available():
    assert choose_extras("auto", COSTS, 160 * MIB)[0] == {FIVE_BITS, PANELS}
    assert choose_extras("auto", COSTS, 10 * MIB)[0] == frozenset()


def test_weights_memory_is_checked_at_the_edge():
    assert ModelConfig(weights_memory="LEAN").weights_memory == "LEAN"
    ModelConfig(weights_memory="3GiB")
    with pytest.raises(ValueError, match="weights_memory must be auto, lean or a size like 3GiB, got 'huge'"):
        ModelConfig(weights_memory="huge")


def test_a_plan_is_settled_once_and_holds_codes_always():
    plan = WeightPlan()
    assert plan.holds(PANELS) and plan.holds(CODES)
    plan.settle(frozenset(), "lean")
    assert not plan.holds(PANELS) and plan.holds(CODES)
    with pytest.raises(RuntimeError, match="settled once"):
        plan.settle(frozenset({PANELS}), "again")


@pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None, reason="the int8 kernels do not run on this CPU")
def test_a_lean_engine_holds_only_codes_and_gives_the_tokens_and_logprobs_of_one_with_every_copy(tmp_path,
                                                                                                  monkeypatch):
    path = mixed_llama_for_engine(tmp_path, monkeypatch)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    prompts = [{"prompt_token_ids": [1, 261, 262, 263, 260, 259, 261, 262] * 3},
               {"prompt_token_ids": [1, 262, 262, 261]}]  # a batch: decode steps of two rows
    runs, held = {}, {}
    for setting in ("auto", "lean"):
        with LLM(model=str(path), dtype="float32", kv_cache_memory="4MiB", weights_memory=setting) as llm:
            model = llm.llm_engine.core.executor.worker.runner.model
            held[setting] = held_layouts(model)
            runs[setting] = llm.generate(prompts, params)
    assert set(held["lean"]) == {CODES} and set(held["auto"]) == {CODES, PANELS}
    assert held["lean"][CODES] == held["auto"][CODES]
    for lean, full in zip(runs["lean"], runs["auto"]):
        assert lean.outputs[0].token_ids == full.outputs[0].token_ids
        # Panels packed per call sum as the prepacked ones do: the same numbers, bit for bit.
        assert lean.outputs[0].logprobs == full.outputs[0].logprobs
        assert lean.prompt_logprobs == full.prompt_logprobs


def test_the_start_up_table_names_each_layout_its_bytes_and_what_it_serves():
    table = format_table({CODES: (100 * MIB, 7), PANELS: (120 * MIB, 7)})
    lines = table.splitlines()
    assert lines[1].split()[:3] == ["codes", "100.0", "7"] and lines[2].split()[:3] == ["panels", "120.0", "7"]
    assert "steps of 2+ rows" in lines[2] and lines[-1].split() == ["total", "220.0"]


def test_held_layouts_counts_a_shared_tensor_once():
    module = torch.nn.Module()
    module.layouts = QuantizedLayouts(bf16_copy=torch.zeros(4, 8))
    other = torch.nn.Module()
    other.layouts = QuantizedLayouts(bf16_copy=module.layouts.bf16_copy)
    parent = torch.nn.Sequential(module, other)
    assert held_layouts(parent) == {BF16_COPY: (128, 1)}
