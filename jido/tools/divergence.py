"""`jido eval divergence`: greedy continuations under the engine's settings against float32 GGUF-native ones.

Perplexity averages over every token; a numeric change shows first where greedy text changes. For windows of each
held-out domain, both engines continue the same prompt greedily; this reports where the continuations first differ
and, there, the float32 reference's gap between its top two log-probabilities: a divergence at a gap of 0.01 nats
is a near-tie either rounding could break, one at 2 nats is an error.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jido.core.sampling_params import SamplingParams
from jido.utils.text_domains import RenderChat, domain_text, parse_domains

if TYPE_CHECKING:  # the engine loads torch: imported by the caller that builds it
    from jido.engine.llm import LLM
    from jido.engine.outputs import RequestOutput


@dataclass(frozen=True)
class DivergenceConfig:
    """Which prompts `jido eval divergence` continues, and how far."""

    domains: str = "all"
    """``all`` or a comma-separated list of jido's held-out domains (see `jido eval perplexity --domains`)."""
    prompts_per_domain: int = 8
    """Windows taken from each domain's text, evenly spaced."""
    prompt_tokens: int = 128
    """Tokens in each prompt window."""
    max_tokens: int = 32
    """Greedy tokens each engine generates per prompt."""
    json: bool = False
    """Print one JSON object instead of a table."""

    def __post_init__(self) -> None:
        parse_domains(self.domains)
        for name in ("prompts_per_domain", "prompt_tokens", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class Divergence:
    """One prompt's comparison: where the continuations first differ (None: they never do) and the reference's
    top-2 log-probability gap there."""

    first_divergence: int | None
    reference_top2_gap: float | None


def prompt_windows(token_ids: list[int], num_windows: int, window: int) -> list[list[int]]:
    """``num_windows`` windows of ``window`` ids, evenly spaced over ``token_ids`` (fewer when it is short)."""
    last_start = len(token_ids) - window
    if last_start < 0:
        return []
    count = min(num_windows, last_start + 1)
    starts = [round(i * last_start / max(1, count - 1)) for i in range(count)]
    return [token_ids[s:s + window] for s in dict.fromkeys(starts)]


def domain_prompts(llm: LLM, config: DivergenceConfig, render_chat: RenderChat) -> dict[str, list[list[int]]]:
    """Each domain's prompt windows, as token ids of ``llm``'s tokenizer."""
    tokenizer = llm.get_tokenizer()
    prompts = {}
    for domain in parse_domains(config.domains):
        ids = tokenizer.encode(domain_text("heldout", domain, render_chat), add_special_tokens=False)
        prompts[domain] = prompt_windows(ids, config.prompts_per_domain, config.prompt_tokens)
    return prompts


def greedy_runs(llm: LLM, prompts: dict[str, list[list[int]]], max_tokens: int) -> dict[str, list[RequestOutput]]:
    """Every prompt continued greedily, with each token's top-2 log-probabilities."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2, ignore_eos=True)
    return {domain: llm.generate(ids, params, use_tqdm=False) for domain, ids in prompts.items()}


def compare(candidate: RequestOutput, reference: RequestOutput) -> Divergence:
    """Where ``candidate``'s greedy tokens first differ from ``reference``'s, and the reference's top-2 gap there."""
    ours, theirs = candidate.outputs[0], reference.outputs[0]
    for position, (a, b) in enumerate(zip(ours.token_ids, theirs.token_ids)):
        if a != b:
            top = sorted(theirs.logprobs[position].top_logprobs, reverse=True)
            return Divergence(position, top[0] - top[1] if len(top) > 1 else None)
    return Divergence(None, None)


def summarize(divergences: list[Divergence], max_tokens: int) -> dict[str, Any]:
    """Prompts, how many continuations matched in full, the median first divergence and the gaps there."""
    diverged = [d for d in divergences if d.first_divergence is not None]
    gaps = sorted(d.reference_top2_gap for d in diverged if d.reference_top2_gap is not None)
    return {"prompts": len(divergences), "identical": len(divergences) - len(diverged), "max_tokens": max_tokens,
            "median_first_divergence": statistics.median(d.first_divergence for d in diverged) if diverged else None,
            "top2_gaps_at_divergence": [round(g, 4) for g in gaps],
            "max_top2_gap_at_divergence": round(gaps[-1], 4) if gaps else None}


def format_summary(domain: str, summary: dict[str, Any]) -> str:
    """One line of `jido eval divergence`'s table."""
    gap = summary["max_top2_gap_at_divergence"]
    first = summary["median_first_divergence"]
    return (f"{domain:<15} {summary['identical']:>3}/{summary['prompts']:<3} identical over {summary['max_tokens']} "
            f"tokens; median first divergence {'-' if first is None else first}; largest reference top-2 gap "
            f"there {'-' if gap is None else f'{gap:.3f} nats'}")


def reference_settings(engine_kwargs: dict[str, Any], from_gguf: bool) -> dict[str, Any]:
    """The float32 reference's engine settings: the candidate's, computed in float32 on the file's own codes (a GGUF
    model) or on float weights, with a float32 KV cache."""
    return {**engine_kwargs, "dtype": "float32", "quantization": "gguf" if from_gguf else "none",
            "kv_cache_dtype": "auto"}


def run(engine_kwargs: dict[str, Any], config: DivergenceConfig) -> dict[str, dict[str, Any]]:
    """Continue every domain's prompts under ``engine_kwargs`` and under the float32 reference, one engine at a
    time; the summary per domain (see :func:`summarize`)."""
    from jido.engine.llm import LLM
    from jido.models.loader import gguf_source
    from jido.tools.perplexity import chat_renderer

    llm = LLM(**engine_kwargs)
    prompts = domain_prompts(llm, config, chat_renderer(llm))
    candidate = greedy_runs(llm, prompts, config.max_tokens)
    from_gguf = gguf_source(llm.llm_engine.model_folder) is not None
    llm.shutdown()
    del llm
    reference_llm = LLM(**reference_settings(engine_kwargs, from_gguf))
    reference = greedy_runs(reference_llm, prompts, config.max_tokens)
    reference_llm.shutdown()
    return {domain: summarize([compare(c, r) for c, r in zip(candidate[domain], reference[domain])],
                              config.max_tokens) for domain in prompts}
