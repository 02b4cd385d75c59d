"""The quality gate: held-out and calibration texts, perplexity per domain, greedy divergence against float32, and
the gate itself on this machine's default path."""
from __future__ import annotations

from pathlib import Path

import pytest

from jido import LLM
from jido.cli import main
from jido.core.outputs import Logprobs
from jido.engine.outputs import CompletionOutput, RequestOutput
from jido.models.loader import resolve_model
from jido.models.tokenizer import Tokenizer
from jido.tools import divergence
from jido.tools.perplexity import PerplexityConfig, evaluate_domains
from jido.utils.text_domains import DOMAINS, conversations, domain_text, parse_domains, plain_transcript

# The gate (issue 56): every default stays within 1.0% of float32 GGUF-native perplexity on every held-out domain.
GATE_PERCENT = 1.0


def test_every_heldout_domain_holds_at_least_5000_tokens_of_the_default_model():
    tokenizer = Tokenizer.from_folder(resolve_model(None))
    counts = {d: len(tokenizer.encode(domain_text("heldout", d), add_special_tokens=False)) for d in DOMAINS}
    assert min(counts.values()) >= 5000, counts


@pytest.mark.parametrize("domain", DOMAINS)
def test_heldout_and_calibration_texts_share_no_passage(domain):
    heldout, calibration = domain_text("heldout", domain), domain_text("calibration", domain)
    windows = [calibration[i:i + 80] for i in range(0, len(calibration) - 80, 401)]
    # Passages, not the numbers generator's table headers: windows of mostly letters.
    shared = [w for w in windows if sum(c.isalpha() for c in w) >= 40 and w in heldout]
    assert len(windows) > 10 and shared == []


def test_chat_conversations_end_with_the_assistant_and_render_through_the_given_template():
    chats = conversations("heldout")
    assert len(chats) >= 10 and all(c[-1]["role"] == "assistant" for c in chats)
    rendered = domain_text("heldout", "chat", lambda messages: f"<{len(messages)}>")
    assert rendered == "\n\n".join(f"<{len(c)}>" for c in chats)
    assert plain_transcript([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]) == \
        "User: hi\n\nAssistant: hello\n"


def test_domains_are_all_or_a_checked_list():
    assert parse_domains("all") == DOMAINS
    assert parse_domains("chat, code_c,chat") == ("chat", "code_c")
    with pytest.raises(ValueError, match="unknown domain.*poetry"):
        parse_domains("prose_en,poetry")
    with pytest.raises(ValueError, match="not one of heldout, calibration"):
        domain_text("train", "chat")  # type: ignore[arg-type]


def test_prompt_windows_are_whole_and_evenly_spaced_from_first_to_last():
    ids = list(range(100))
    assert divergence.prompt_windows(ids, 3, 10) == [ids[0:10], ids[45:55], ids[90:100]]
    assert divergence.prompt_windows(ids[:12], 8, 10) == [ids[0:10], ids[1:11], ids[2:12]]
    assert divergence.prompt_windows(ids[:5], 2, 10) == []


def _output(token_ids: list[int], top2: list[tuple[float, float]]) -> RequestOutput:
    logprobs = [Logprobs(t, a, [t, t + 1000], [a, b]) for t, (a, b) in zip(token_ids, top2)]
    return RequestOutput("0", None, [1], [CompletionOutput(0, "", token_ids, None, logprobs)], True)


def test_divergence_is_the_first_differing_token_with_the_references_top2_gap_there():
    reference = _output([5, 6, 7, 8], [(-0.1, -3.0), (-0.5, -0.75), (-0.2, -2.0), (-0.1, -4.0)])
    assert divergence.compare(_output([5, 9, 7, 8], [(0, 0)] * 4), reference) == divergence.Divergence(1, 0.25)
    assert divergence.compare(_output([5, 6, 7, 8], [(0, 0)] * 4), reference) == divergence.Divergence(None, None)
    summary = divergence.summarize([divergence.Divergence(1, 0.2), divergence.Divergence(None, None),
                                    divergence.Divergence(3, 0.05)], 4)
    assert summary == {"prompts": 3, "identical": 1, "max_tokens": 4, "median_first_divergence": 2.0,
                       "top2_gaps_at_divergence": [0.05, 0.2], "max_top2_gap_at_divergence": 0.2}


def test_divergence_reference_is_float32_on_the_files_codes_with_a_float32_cache():
    settings = divergence.reference_settings({"dtype": "bfloat16", "kv_cache_dtype": "int8", "max_num_seqs": 4}, True)
    assert settings == {"dtype": "float32", "quantization": "gguf", "kv_cache_dtype": "auto", "max_num_seqs": 4}
    assert divergence.reference_settings({}, False)["quantization"] == "none"


def test_an_engine_matches_itself_as_the_float32_reference(tiny_model_folder: Path):
    engine = {"model": str(tiny_model_folder), "dtype": "float32", "kv_cache_memory": "4MiB"}
    config = divergence.DivergenceConfig(domains="prose_en,code_c", prompts_per_domain=2, prompt_tokens=16,
                                         max_tokens=6)
    summaries = divergence.run(engine, config)
    assert {d: (s["prompts"], s["identical"]) for d, s in summaries.items()} == {"prose_en": (2, 2),
                                                                                 "code_c": (2, 2)}


def test_cli_scores_each_domain_asked_for_and_refuses_a_file_with_domains(tiny_model_folder, tmp_path, capsys):
    flags = ["--model", str(tiny_model_folder), "--dtype=float32", "--kv-cache-memory=4MiB"]
    assert main(["--log-level", "warning", "eval", "perplexity", *flags, "--domains", "prose_en,numbers_tables",
                 "--context-length=24", "--max-chunks=1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["prose_en", "numbers_tables"]
    assert all(" perplexity " in line and "(1 chunk of 24" in line for line in lines)
    text = tmp_path / "t.txt"
    text.write_text("w3 w4 w5 w6", encoding="utf-8")
    assert main(["eval", "perplexity", *flags, "--domains", "all", str(text)]) == 2
    assert "give either FILE or --domains" in capsys.readouterr().err


@pytest.mark.slow
def test_the_default_path_is_within_one_percent_of_float32_gguf_native_on_every_heldout_domain():
    # A short gate: the first 256-token chunk of each domain (benchmarks/quality_gate.py runs the full one).
    config = PerplexityConfig(context_length=256, max_chunks=1, domains="all")
    figures = {}
    for name, settings in (("default", {}), ("reference", {"dtype": "float32", "quantization": "gguf"})):
        llm = LLM(kv_cache_memory="64MiB", **settings)
        figures[name] = {d: r.perplexity for d, r in evaluate_domains(llm, config).items()}
        llm.shutdown()
        del llm
    excess = {d: 100 * (figures["default"][d] / figures["reference"][d] - 1) for d in DOMAINS}
    assert max(excess.values()) <= GATE_PERCENT, excess
