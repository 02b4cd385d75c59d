"""`jido train-draft`: train an EAGLE draft or Medusa heads on the target's own continuations of a text corpus, on CPU.

The data: windows of the corpus (pydoc's topics by default, on every machine with Python) as prompts, each
continued by the target itself, half greedily and half sampled at temperature 0.7, then run once more through
the target to read its final hidden state at every position. The prompt positions count too: there the target's
hidden states follow the corpus, and its predictions are still its own.

EAGLE's loss at draft entry ``i``: cross-entropy from the target's next-token distribution (its hidden state
``h_{i+1}`` through its LM head rows of the draft vocabulary) to the draft's, plus a smooth-L1 pull of the
predicted state towards ``h_{i+1}`` (EAGLE's two losses). Every step unrolls ``train_depth`` passes: pass ``d``
feeds each entry the previous pass's prediction where the target's state stood and attends, as when
proposing, to the target-fed entries up to ``d - 1`` positions back and to its own chain after them (EAGLE-3's
training-time test). Without it, acceptance past the first proposal falls.

Medusa's loss: head ``k`` at position ``t`` guesses the token ``k + 1`` places on, whose distribution is the target's
own next-token distribution at ``h_{t+k}``; the cross-entropy from that one to the head's, weighted ``0.8^(k-1)``.

A tenth of the topics (every tenth, by name) is never trained on; `benchmarks/spec_decode.py` prompts from them.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pydoc_data.topics import topics

from jido.attention.backend import StepAttentionMetadata, build_common_metadata
from jido.attention.registry import get_attention_backend
from jido.core.sampling_params import SamplingParams
from jido.models.config import ModelArchConfig
from jido.models.eagle import EagleDraft, EagleDraftConfig
from jido.models.medusa import MedusaConfig, MedusaHeads
from jido.models.loader import gguf_source, load_config, resolve_model
from jido.runner.model_loading import DTYPES, load_model, resolve_dtype, resolve_quantization
from jido.utils.cli_args import add_dataclass_arguments, dataclass_kwargs
from jido.utils.cpu import cpu_info

logger = logging.getLogger(__name__)
HOLDOUT_EVERY = 10  # topic i (in name order) is held out when i % HOLDOUT_EVERY == 0
SAMPLED_TEMPERATURE = 0.7
EVAL_FRACTION = 0.1  # of the sequences: scored after training, never trained on
BLOCK_SIZE = 16
METHODS = ("eagle", "medusa")
DEPTH_WEIGHT = 0.8  # a proposal's loss weight falls by this per depth: later ones are reached less often


@dataclass(frozen=True)
class TrainDraftConfig:
    """What `jido train-draft` trains, on what data, for how long."""

    out: str
    """The folder to write the draft to (``--speculative-config '{"method": METHOD, "model": OUT}'``)."""
    method: str = "eagle"
    """The draft kind: eagle (one decoder layer on the target's hidden states) or medusa (heads on its newest one)."""
    model: str | None = None
    """The target: a .gguf file, an HF checkpoint folder or a model name (default: the embedded Gemma 3 270M)."""
    quantization: str | None = None
    """The target's --quantization, as it will be served (default: gguf for a GGUF model)."""
    dtype: str = "auto"
    """The target's --dtype, as it will be served: its hidden states are read in it (auto: as the engine resolves
    it on this machine)."""
    corpus: str | None = None
    """A UTF-8 text file to take prompts from (default: pydoc's topics, less the held-out tenth)."""
    num_prompts: int = 160
    """Corpus windows the target continues."""
    prompt_len: int = 96
    """Tokens per prompt."""
    max_tokens: int = 160
    """Tokens the target generates per prompt."""
    corpus_windows: int = 256
    """Windows of the corpus (prompt_len + max_tokens tokens each) read through the target without generating:
    its hidden states there follow the corpus, its predictions are still its own; several times cheaper per token."""
    draft_vocab_size: int = 16384
    """Rows of the target's LM head the draft proposes from: the tokens most frequent in the data."""
    intermediate_size: int | None = None
    """The draft layer's MLP width (default: the target's)."""
    steps: int = 350
    """Optimizer steps."""
    batch_size: int = 4
    """Sequences per step."""
    train_depth: int = 3
    """EAGLE: passes unrolled per step (see the module docstring)."""
    num_heads: int = 4
    """Medusa: heads, the most tokens they propose per step."""
    num_layers: int = 1
    """Medusa: residual blocks per head."""
    learning_rate: float = 1e-3
    seed: int = 0
    kv_cache_memory: str | None = None
    """The generating engine's --kv-cache-memory (default: the engine's)."""
    threads: int | None = None
    """torch threads (default: torch's choice)."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"train-draft method must be one of {', '.join(METHODS)}, got {self.method!r}")
        for name in ("num_prompts", "prompt_len", "max_tokens", "draft_vocab_size", "steps", "batch_size",
                     "train_depth", "num_heads", "num_layers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.corpus_windows, int) or self.corpus_windows < 0:
            raise ValueError(f"corpus_windows must be an integer >= 0, got {self.corpus_windows!r}")
        if self.num_prompts < 2:
            raise ValueError("num_prompts must be at least 2: a tenth of the sequences (at least one) is held out "
                             "to score the draft")


@dataclass
class TrainingSequence:
    """One training sequence: its tokens and the target's final hidden state at each."""

    token_ids: torch.Tensor  # [L] long
    hidden: torch.Tensor  # [L, hidden] float32


def _topics_text(held_out: bool) -> str:
    return "\n\n".join(topics[name].strip() for i, name in enumerate(sorted(topics))
                       if (i % HOLDOUT_EVERY == 0) == held_out)


def training_text() -> str:
    """The topics trained on: all but every tenth, in name order."""
    return _topics_text(held_out=False)


def held_out_text() -> str:
    """The held-out topics' text: prompts for measuring a draft on text it was not trained on."""
    return _topics_text(held_out=True)


class Target:
    """The target model loaded for reading its hidden states (not served: no scheduler, one prefill per batch)."""

    def __init__(self, model: str | None, quantization: str | None, dtype: str = "float32") -> None:
        self.folder = resolve_model(model)
        self.arch = ModelArchConfig.from_hf_config(load_config(self.folder))
        self.device = torch.device("cpu")
        # The served dtype, not float32: the draft then trains on the hidden states it will be given. Drafts trained
        # on float32 states and served under a bf16 target had their first proposal accepted less often than with
        # the engine in float32.
        self.dtype = resolve_dtype(dtype, self.device)
        self.quantization = resolve_quantization(quantization, self.device, gguf_source(self.folder) is not None)
        self.backend = get_attention_backend("torch")
        self.model = load_model(self.folder, self.arch, self.backend, self.device, self.dtype, self.quantization, None)

    @torch.inference_mode()
    def hidden_states(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """The final hidden state at every position of each sequence, in one prefill over a fresh cache."""
        lens = [len(s) for s in sequences]
        blocks = [-(-n // BLOCK_SIZE) for n in lens]
        table = np.zeros((len(sequences), max(blocks)), dtype=np.int64)
        start = 0
        for i, n in enumerate(blocks):
            table[i, :n] = np.arange(start, start + n)
            start += n
        shape = self.backend.get_kv_cache_shape(start, BLOCK_SIZE, self.arch.num_kv_heads, self.arch.head_dim,
                                                self.dtype)
        caches = [torch.zeros(shape, dtype=self.dtype) for _ in range(self.arch.num_layers)]
        common = build_common_metadata(lens, lens, table, BLOCK_SIZE, self.device)
        metadata = StepAttentionMetadata([self.backend.build_metadata(common)] * self.arch.num_layers, max(lens))
        ids = torch.tensor([t for s in sequences for t in s])
        positions = torch.tensor([p for n in lens for p in range(n)])
        hidden = self.model(ids, positions, caches, metadata).float()
        return list(hidden.split(lens))

    @torch.no_grad()  # not inference mode: the draft's autograd reads these
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed(token_ids.flatten()).float().view(*token_ids.shape, -1)

    @torch.inference_mode()
    def lm_head_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The LM head's rows for ``token_ids`` ``[n, hidden]``: its logits for the unit vectors, as its kernel
        computes them (a soft-cap undone: a weight is far below any cap, where tanh is invertible)."""
        eye = torch.eye(self.arch.hidden_size, dtype=self.dtype)
        rows = self.model.compute_logits(eye).float()[:, token_ids].T.contiguous()
        cap = self.arch.final_logit_softcapping
        return rows if cap is None else cap * torch.atanh(rows / cap)


def generate_sequences(config: TrainDraftConfig, target_folder: Path
                       ) -> tuple[list[list[int]], list[list[int]], dict]:
    """Prompts from the corpus continued by the target as it is served (each whole sequence's token ids), and
    the corpus windows read as they are."""
    from jido.engine.llm import LLM  # the engine, only for generating

    text = Path(config.corpus).read_text(encoding="utf-8") if config.corpus else training_text()
    engine = {"kv_cache_memory": config.kv_cache_memory} if config.kv_cache_memory else {}
    llm = LLM(model=str(target_folder), quantization=config.quantization, dtype=config.dtype, seed=config.seed,
              **engine)
    corpus_ids = llm.get_tokenizer().encode(text, add_special_tokens=False)
    if len(corpus_ids) < config.prompt_len + 1:
        raise ValueError(f"the corpus has {len(corpus_ids)} tokens: too few for prompts of {config.prompt_len}")
    rng = np.random.default_rng(config.seed)
    bos = [llm.get_tokenizer().bos_token_id] if llm.get_tokenizer().bos_token_id is not None else []
    starts = rng.integers(0, len(corpus_ids) - config.prompt_len, size=config.num_prompts)
    prompts = [bos + corpus_ids[s:s + config.prompt_len] for s in starts.tolist()]
    params = [SamplingParams(temperature=0.0 if i % 2 == 0 else SAMPLED_TEMPERATURE, seed=config.seed + i,
                             max_tokens=config.max_tokens) for i in range(len(prompts))]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    llm.shutdown()
    sequences = [p + list(o.outputs[0].token_ids) for p, o in zip(prompts, outputs)]
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    length = min(config.prompt_len + config.max_tokens, len(corpus_ids))
    window_starts = rng.integers(0, len(corpus_ids) - length + 1, size=config.corpus_windows)
    windows = [bos + corpus_ids[s:s + length] for s in window_starts.tolist()]
    return sequences, windows, {"generated_tokens": generated, "generate_s": round(seconds, 1),
                                "corpus": config.corpus or "pydoc topics less every tenth",
                                "corpus_tokens": len(corpus_ids), "corpus_windows": len(windows)}


def draft_vocabulary(sequences: list[list[int]], size: int, vocab_size: int) -> tuple[torch.Tensor, float]:
    """The ``size`` tokens most frequent in the sequences (ties and the rest by id), and the share of the data's
    tokens they cover."""
    counts = Counter(t for s in sequences for t in s[1:])
    ranked = [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][:size]
    ranked += [t for t in range(vocab_size) if t not in counts][:size - len(ranked)]
    covered = sum(counts[t] for t in ranked) / max(1, sum(counts.values()))
    return torch.tensor(sorted(ranked)), covered


def pass_mask(num: int, depth: int) -> torch.Tensor:
    """Which keys pass ``depth`` (1-based) sees, ``[num, depth * num]``: the target-fed entries up to ``depth - 1``
    positions back, then one entry of each later pass along its own chain, ending with its own."""
    i = torch.arange(num)[:, None]
    j = torch.arange(num)[None, :]
    masks = [j <= i - depth + 1] + [j == i - depth + d for d in range(2, depth + 1)]
    return torch.cat(masks, dim=1)


def unrolled_passes(draft: EagleDraft, hidden: torch.Tensor, embeds: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """Each pass's predicted hidden states ``[B, L - 1, H]`` over a padded batch (``hidden`` [B, L, H], ``embeds``:
    of the tokens after the first): entry ``i`` of pass ``d`` is the proposal ``d`` steps into a chain whose
    target-fed entries end at ``i - d + 1``."""
    c = draft.config
    batch, length, size = hidden.shape
    num = length - 1
    positions = torch.arange(num).repeat(batch)
    inputs, keys, values, passes = hidden[:, :-1], [], [], []
    for d in range(1, depth + 1):
        x, q, k, v = draft.project(embeds.reshape(-1, size), inputs.reshape(-1, size), positions)
        keys.append(k.view(batch, num, c.num_kv_heads, c.head_dim).transpose(1, 2))
        values.append(v.view(batch, num, c.num_kv_heads, c.head_dim).transpose(1, 2))
        queries = q.view(batch, num, c.num_heads, c.head_dim).transpose(1, 2)
        attended = F.scaled_dot_product_attention(queries, torch.cat(keys, 2), torch.cat(values, 2),
                                                  attn_mask=pass_mask(num, d), scale=draft.scale,
                                                  enable_gqa=c.num_heads != c.num_kv_heads)
        features = draft.finish(x, attended.transpose(1, 2).reshape(batch * num, -1)).view(batch, num, size)
        passes.append(features)
        inputs = torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
    return passes


def unrolled_loss(draft: EagleDraft, token_ids: torch.Tensor, hidden: torch.Tensor, lengths: torch.Tensor,
                  embeds: torch.Tensor, depth: int) -> tuple[torch.Tensor, list[dict]]:
    """The training loss over a padded batch (see :func:`make_batch`), and per pass its cross-entropy and top-1
    agreement with the target."""
    num = hidden.shape[1] - 1
    with torch.no_grad():
        target_next = hidden[:, 1:]
        target_probs = torch.softmax(draft.logits(target_next), dim=-1)
        target_top = target_probs.argmax(dim=-1)
    valid = torch.arange(num)[None, :] < (lengths - 1)[:, None]
    total, stats = hidden.new_zeros(()), []
    for d, features in enumerate(unrolled_passes(draft, hidden, embeds, depth), start=1):
        log_q = torch.log_softmax(draft.logits(features), dim=-1)
        scored = valid & (torch.arange(num)[None, :] >= d - 1)
        cross_entropy = -(target_probs * log_q).sum(-1)[scored].mean()
        regression = F.smooth_l1_loss(features[scored], target_next[scored])
        total = total + DEPTH_WEIGHT ** (d - 1) * (cross_entropy + regression)
        agree = (log_q.argmax(-1) == target_top)[scored].float().mean()
        stats.append({"depth": d, "cross_entropy": cross_entropy.item(), "regression": regression.item(),
                      "top1_agreement": agree.item()})
    return total, stats


def medusa_loss(heads: MedusaHeads, hidden: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
    """The heads' training loss over a padded batch (``hidden`` [B, L, H]), and per head its cross-entropy, its top-1
    agreement with the target, and how often it and every head before it agree (a greedy chain's acceptance)."""
    batch, length, size = hidden.shape
    with torch.no_grad():
        target_probs = torch.softmax(heads.logits(hidden), dim=-1)  # the target's, at each position, for the next
        target_top = target_probs.argmax(dim=-1)
    valid = torch.arange(length)[None, :] < lengths[:, None]
    chain = torch.ones(batch, length, dtype=torch.bool)
    total, stats = hidden.new_zeros(()), []
    for k in range(1, min(heads.config.num_heads, length - 1) + 1):
        num = length - k  # positions t with a position t + k to learn from
        features = heads.features(hidden[:, :num].reshape(-1, size), k - 1).view(batch, num, size)
        log_q = torch.log_softmax(heads.logits(features), dim=-1)
        scored = valid[:, k:]
        cross_entropy = -(target_probs[:, k:] * log_q).sum(-1)[scored].mean()
        total = total + DEPTH_WEIGHT ** (k - 1) * cross_entropy
        hits = log_q.argmax(-1) == target_top[:, k:]
        chain = chain[:, :num] & hits
        stats.append({"depth": k, "cross_entropy": cross_entropy.item(),
                      "top1_agreement": hits[scored].float().mean().item(),
                      "chain_agreement": chain[scored].float().mean().item()})
    return total, stats


def draft_loss(draft: EagleDraft | MedusaHeads, batch: tuple[torch.Tensor, ...], config: TrainDraftConfig
               ) -> tuple[torch.Tensor, list[dict]]:
    """The loss of ``draft`` on a batch from :func:`make_batch`, and its per-depth statistics."""
    if isinstance(draft, MedusaHeads):
        return medusa_loss(draft, batch[1], batch[2])
    return unrolled_loss(draft, *batch, config.train_depth)


def make_batch(data: list[TrainingSequence], target: Target) -> tuple[torch.Tensor, ...]:
    """Token ids [B, L] and hidden states [B, L, H] padded at the end, the lengths, and the embeddings of the
    tokens after the first (each entry's token)."""
    length = max(len(s.token_ids) for s in data)
    ids = torch.zeros(len(data), length, dtype=torch.long)
    hidden = torch.zeros(len(data), length, data[0].hidden.shape[1])
    for i, s in enumerate(data):
        ids[i, :len(s.token_ids)], hidden[i, :len(s.token_ids)] = s.token_ids, s.hidden
    lengths = torch.tensor([len(s.token_ids) for s in data])
    return ids, hidden, lengths, target.embed(ids[:, 1:])


def new_draft(arch: ModelArchConfig, config: TrainDraftConfig, vocab: torch.Tensor, head_rows: torch.Tensor,
              target_description: dict) -> EagleDraft | MedusaHeads:
    """An untrained draft of ``config.method`` for the target: the LM head rows of ``vocab``, frozen; EAGLE's layer
    drawn at random, Medusa's blocks at zero (each head starts as the target's own next-token guess)."""
    if config.method == "medusa":
        draft = MedusaHeads(MedusaConfig(hidden_size=arch.hidden_size, num_heads=config.num_heads,
                                         num_layers=config.num_layers, draft_vocab_size=len(vocab),
                                         target_vocab_size=arch.vocab_size,
                                         final_logit_softcapping=arch.final_logit_softcapping,
                                         target=target_description))
    else:
        draft = EagleDraft(EagleDraftConfig(
            hidden_size=arch.hidden_size, intermediate_size=config.intermediate_size or arch.intermediate_size,
            num_heads=arch.num_heads, num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
            draft_vocab_size=len(vocab), target_vocab_size=arch.vocab_size, hidden_act=arch.hidden_act,
            rms_norm_eps=arch.rms_norm_eps, final_logit_softcapping=arch.final_logit_softcapping,
            target=target_description))
        generator = torch.Generator().manual_seed(config.seed)
        for name, param in draft.named_parameters():
            if param.dim() == 2 and not name.startswith("lm_head"):
                param.data.normal_(0.0, 0.02, generator=generator)
    draft.lm_head.weight.data.copy_(head_rows)
    draft.lm_head.weight.requires_grad_(False)
    draft.draft_vocab.copy_(vocab)
    return draft


def train(draft: EagleDraft | MedusaHeads, train_data: list[TrainingSequence], eval_data: list[TrainingSequence],
          target: Target, config: TrainDraftConfig) -> dict:
    """AdamW with a cosine schedule after a short warm-up; the last steps' losses and the held-out agreement, trained
    and untrained."""
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
    warmup = max(1, config.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / config.steps))))
    rng = np.random.default_rng(config.seed)
    history = []
    before = evaluate(draft, eval_data, target, config)
    start = time.perf_counter()
    draft.train()
    for step in range(config.steps):
        picked = rng.choice(len(train_data), size=min(config.batch_size, len(train_data)), replace=False)
        loss, stats = draft_loss(draft, make_batch([train_data[i] for i in picked], target), config)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        history.append(loss.item())
        if step % 50 == 0 or step == config.steps - 1:
            logger.info("step %d/%d: loss %.3f, top-1 agreement by depth %s (%.0f s)", step + 1, config.steps,
                        loss.item(), [round(s["top1_agreement"], 3) for s in stats], time.perf_counter() - start)
    draft.eval()
    return {"steps": config.steps, "train_s": round(time.perf_counter() - start, 1),
            "first_loss": round(history[0], 4), "last_loss": round(float(np.mean(history[-20:])), 4),
            "held_out": evaluate(draft, eval_data, target, config), "held_out_untrained": before}


@torch.no_grad()
def evaluate(draft: EagleDraft | MedusaHeads, data: list[TrainingSequence], target: Target,
             config: TrainDraftConfig) -> list[dict]:
    """Per depth, on sequences it never trained on: the cross-entropy from the target's distribution to the draft's,
    how often the draft's top token is the target's, and (Medusa) how often every head up to that depth agrees."""
    sums: dict[int, dict[str, list[float]]] = {}
    for start in range(0, len(data), config.batch_size):
        _, stats = draft_loss(draft, make_batch(data[start:start + config.batch_size], target), config)
        for s in stats:
            for name in ("cross_entropy", "top1_agreement", "chain_agreement"):
                if name in s:
                    sums.setdefault(s["depth"], {}).setdefault(name, []).append(s[name])
    return [{"depth": d, **{name: round(float(np.mean(v)), 4) for name, v in values.items()}}
            for d, values in sorted(sums.items())]


def train_draft(config: TrainDraftConfig) -> dict:
    """Generate the data, train, write the draft to ``config.out``; what was done and measured."""
    torch.manual_seed(config.seed)
    if config.threads:
        torch.set_num_threads(config.threads)
    begin = time.perf_counter()
    folder = resolve_model(config.model)
    generated, windows, data_info = generate_sequences(config, folder)
    target = Target(str(folder), config.quantization, config.dtype)
    start = time.perf_counter()
    sequences, hidden = generated + windows, []
    for i in range(0, len(sequences), config.batch_size):
        hidden.extend(target.hidden_states(sequences[i:i + config.batch_size]))
    data_info["hidden_s"] = round(time.perf_counter() - start, 1)
    data = [TrainingSequence(torch.tensor(s), h) for s, h in zip(sequences, hidden)]
    # Scored on generated sequences only: proposing follows the target's own text.
    num_eval = max(1, int(len(generated) * EVAL_FRACTION))
    train_data, eval_data = data[num_eval:], data[:num_eval]
    vocab, coverage = draft_vocabulary([s.token_ids.tolist() for s in train_data], config.draft_vocab_size,
                                       target.arch.vocab_size)
    description = {"model": str(config.model or "default"), "folder": str(folder),
                   "quantization": target.quantization, "dtype": str(target.dtype).removeprefix("torch."),
                   "architecture": target.arch.architecture}
    draft = new_draft(target.arch, config, vocab, target.lm_head_rows(vocab), description)
    result = train(draft, train_data, eval_data, target, config)
    data_info.update(sequences=len(data), train_sequences=len(train_data), eval_sequences=len(eval_data),
                     train_tokens=sum(len(s.token_ids) for s in train_data), draft_vocab_coverage=round(coverage, 4))
    record = {"config": asdict(config), "data": data_info, "training": result,
              "total_s": round(time.perf_counter() - begin, 1), "cpu": cpu_info().describe()}
    draft.save(Path(config.out), training=record)
    return record


def train_draft_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jido train-draft", description=__doc__.split("\n\n")[0])
    add_dataclass_arguments(parser, TrainDraftConfig)
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("--out is required: the folder to write the draft to")
    try:
        config = TrainDraftConfig(**dataclass_kwargs(args, TrainDraftConfig))
        record = train_draft(config)
    except ValueError as error:
        print(f"jido train-draft: {error}", file=sys.stderr)
        return 2
    print(json.dumps(record, indent=2))
    return 0
