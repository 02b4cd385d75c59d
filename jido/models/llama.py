"""Llama: the decoder the other families build on (GQA, RoPE, gated MLP, RMSNorm), with HF weight names."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from jido.attention.backend import AttentionBackend, AttentionLayerSpec, StepAttentionMetadata
from jido.layers.activation import get_gated_activation
from jido.layers.linear import MergedLinear
from jido.layers.parallel_linear import (ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear,
                                         RowParallelLinear, VocabParallelEmbedding, gather_logits)
from jido.layers.quantization import QuantizationConfig, get_quantization_config
from jido.layers.rms_norm import RMSNorm
from jido.layers.rotary import RotaryEmbedding, norm_and_rotate_qk
from jido.models.config import ModelArchConfig
from jido.parallel.state import current, layer_range

RopeCosSin = tuple[torch.Tensor, torch.Tensor]

# HF projection name -> (our fused module, shard name inside it).
_FUSED_SHARDS = {
    "q_proj": ("qkv_proj", "q_proj"),
    "k_proj": ("qkv_proj", "k_proj"),
    "v_proj": ("qkv_proj", "v_proj"),
    "gate_proj": ("gate_up_proj", "gate_proj"),
    "up_proj": ("gate_up_proj", "up_proj"),
}


class LlamaAttention(nn.Module):
    """Fused QKV projection, optional per-head q/k RMSNorm, RoPE, then the paged attention backend."""

    def __init__(
        self,
        config: ModelArchConfig,
        layer_idx: int,
        backend: AttentionBackend,
        unit_offset_norm: bool = False,
        quant_config: QuantizationConfig | None = None,
    ):
        super().__init__()
        c = config
        # Split by heads over the TP ranks: this rank's query heads and KV heads (see QKVParallelLinear).
        self.qkv_proj = QKVParallelLinear(c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads, bias=c.qkv_bias,
                                          quant_config=quant_config)
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias,
                                        quant_config=quant_config)
        # None where the family has no q/k norm (a plain attribute then, read without nn.Module's lookup)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, unit_offset_norm) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, unit_offset_norm) if c.qk_norm else None
        self.backend = backend
        self.spec = AttentionLayerSpec(
            num_heads=self.qkv_proj.num_heads,
            num_kv_heads=self.qkv_proj.num_kv_heads,
            head_dim=c.head_dim,
            scale=c.attn_scale,
            sliding_window=c.sliding_windows[layer_idx],
            logit_softcap=c.attn_logit_softcapping,
        )

    def forward(self, x: torch.Tensor, rope: RopeCosSin, kv_cache: torch.Tensor, metadata: Any) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        # [num_tokens, q_size] and [num_tokens, kv_size]
        q, k = norm_and_rotate_qk(qkv, self.q_size, self.kv_size, self.spec.head_dim, *rope, self.q_norm, self.k_norm)
        v = qkv[:, self.q_size + self.kv_size:]
        return self.o_proj(self.backend.forward(self.spec, q, k, v, kv_cache, metadata))


class LlamaMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused into one matmul."""

    def __init__(self, config: ModelArchConfig, quant_config: QuantizationConfig | None = None):
        super().__init__()
        sizes = {"gate_proj": config.intermediate_size, "up_proj": config.intermediate_size}
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, sizes, quant_config=quant_config)
        # Read by the linear method when it packs the loaded weight: it may fuse the activation into the product.
        self.gate_up_proj.gated_activation = config.hidden_act
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, quant_config=quant_config)
        self.act = get_gated_activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.gate_up_proj.gated(x)
        return self.down_proj(fused if fused is not None else self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(
        self,
        config: ModelArchConfig,
        layer_idx: int,
        backend: AttentionBackend,
        quant_config: QuantizationConfig | None = None,
    ):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx, backend, quant_config=quant_config)
        self.mlp = LlamaMLP(config, quant_config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: RopeCosSin, kv_cache: torch.Tensor, metadata: Any) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, metadata)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Embedding, decoder layers and final norm; HF's ``model.*`` parameter names.

    On a pipeline stage it holds only its layers (``start_layer`` to ``end_layer``; the others are empty
    placeholders), the embedding only on the first stage (and on the last when the LM head is tied to it),
    and the final norm only on the last.
    """

    def __init__(
        self,
        config: ModelArchConfig,
        backend: AttentionBackend,
        layer_cls: type[nn.Module],
        unit_offset_norm: bool,
        quant_config: QuantizationConfig | None = None,
    ):
        super().__init__()
        self.config = config
        pp = current().pp
        self.is_first_stage, self.is_last_stage = pp.is_first, pp.is_last
        self.start_layer, self.end_layer = layer_range(config.num_layers, pp)
        needs_table = pp.is_first or (pp.is_last and config.tie_word_embeddings)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size) if needs_table else None
        self.layers = nn.ModuleList([layer_cls(config, i, backend, quant_config)
                                     if self.start_layer <= i < self.end_layer else nn.Identity()
                                     for i in range(config.num_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, unit_offset_norm) if pp.is_last else None
        # One table per distinct (base, scaling), in order of first use; each layer looks its table up by key.
        ropes = dict.fromkeys(config.layer_rope(i) for i in range(config.num_layers))
        self.ropes = nn.ModuleList([RotaryEmbedding(config.head_dim, theta, scaling) for theta, scaling in ropes])
        rope_keys = list(ropes)
        self.layer_rope_idx = [rope_keys.index(config.layer_rope(i)) for i in range(config.num_layers)]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: StepAttentionMetadata,
        hidden_states: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.embed(input_ids) if self.is_first_stage else hidden_states
        # As many layers as caches were given: fewer run only the first ones (a layer-truncated self-draft).
        x = self.forward_layers(x, positions, kv_caches, attn_metadata,
                                range(self.start_layer, min(self.end_layer, len(kv_caches))))
        return self.norm(x) if self.is_last_stage else x

    def forward_layers(self, x: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                       attn_metadata: StepAttentionMetadata, layer_ids: range) -> torch.Tensor:
        """Run decoder layers ``layer_ids`` (consecutive) on hidden states ``x`` ``[num_tokens, hidden]``."""
        ropes = [rope(positions, attn_metadata.max_seq_len) for rope in self.ropes]
        for i in layer_ids:
            x = self.layers[i](x, ropes[self.layer_rope_idx[i]], kv_caches[i], attn_metadata.per_layer[i])
        return x


class LlamaForCausalLM(nn.Module):
    """A decoder-only LM over a flat batch of many requests and a paged KV cache (see ``forward``).

    Parameters are created uninitialised on the default device and dtype (build it inside
    :func:`~jido.layers.parameter.default_device_and_dtype`), then filled by :meth:`load_weights`.
    ``quant_config`` chooses how linear layers and the LM head store and apply their weights (default: dense).
    """

    model_cls: type[LlamaModel] = LlamaModel
    layer_cls: type[nn.Module] = LlamaDecoderLayer
    unit_offset_norm = False  # Gemma's norms scale by (1 + w)

    def __init__(
        self, config: ModelArchConfig, attn_backend: AttentionBackend, quant_config: QuantizationConfig | None = None
    ):
        super().__init__()
        quant_config = quant_config or get_quantization_config()
        self.config = config
        self.model = self.model_cls(config, attn_backend, self.layer_cls, self.unit_offset_norm, quant_config)
        self.tp = current().tp
        # NOTE: a tied head *is* the embedding module: one parameter, named and loaded as the embedding.
        # Only the last pipeline stage has a head; its logits are split by vocabulary over the TP ranks.
        if not self.model.is_last_stage:
            self.lm_head: nn.Module | None = None
        elif config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ColumnParallelLinear(config.hidden_size, config.vocab_size, quant_config=quant_config)
        if self.lm_head is not None:
            self.logits_method = quant_config.get_logits_method(self.lm_head)
            if not config.tie_word_embeddings:  # an untied head is a Linear: it runs, and loads, as the LM head
                self.lm_head.linear_method = self.logits_method

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: StepAttentionMetadata,
        hidden_states: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run a flat batch ``[num_tokens]`` (token ids and positions); returns hidden states ``[num_tokens, hidden]``.

        ``kv_caches[i]`` and ``attn_metadata.per_layer[i]`` are layer ``i``'s cache tensor and backend
        metadata; the backend writes this step's K/V into the cache in its own layout. A pipeline stage after
        the first takes the previous stage's ``hidden_states`` instead of embedding ``input_ids``, and a stage
        before the last returns its hidden states un-normed. Given caches for only the first ``n`` layers, only
        those run (then the final norm): the target's early exit, which a layer-truncated self-draft proposes with.
        """
        return self.model(input_ids, positions, kv_caches, attn_metadata, hidden_states)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The hidden states ``[num_tokens, hidden]`` that enter the first layer."""
        return self.model.embed(input_ids)

    def forward_layers(self, x: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                       attn_metadata: StepAttentionMetadata, layer_ids: range) -> torch.Tensor:
        """Layers ``layer_ids`` of :meth:`forward` alone: a forward may change its tokens between layers (CacheBlend)."""
        return self.model.forward_layers(x, positions, kv_caches, attn_metadata, layer_ids)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.norm(x)

    def rotary(self, layer_id: int) -> RotaryEmbedding:
        """The RoPE table layer ``layer_id`` rotates its queries and keys with (Gemma 3: local or global base)."""
        return self.model.ropes[self.model.layer_rope_idx[layer_id]]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[N, vocab]`` for the rows the caller samples from, soft-capped if configured."""
        logits = gather_logits(self.tp, self.logits_method.apply_logits(self.lm_head, hidden)).float()
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def greedy_token_ids(self, hidden: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor | None:
        """Each row's argmax of :meth:`compute_logits` ([N] int64) where the head's kernels give it without making
        the logits (``LinearMethod.greedy_token_ids``; under ``allowed``, each row's grammar bitmask, the argmax over
        the columns it allows); None where they do not, or the logits are soft-capped (capped values may tie where the
        raw ones do not) or split over tensor-parallel ranks."""
        if self.config.final_logit_softcapping is not None or self.tp.world_size > 1:
            return None
        return self.logits_method.greedy_token_ids(self.lm_head, hidden, allowed)

    def hf_name(self, name: str) -> str | None:
        """Normalise a checkpoint name to ours' HF layout; ``None`` for tensors we do not use."""
        return None if "rotary_emb.inv_freq" in name else name

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Hand each HF-named tensor to its parameter's ``weight_loader`` (which fuses q/k/v and gate/up).

        Raises:
            ValueError: a name we have no parameter for, a shape mismatch, or parameters left unloaded
                (all named in the message).
        """
        params = dict(self.named_parameters())
        expected = self._expected_hf_names(params)
        loaded, unexpected = set(), []
        for raw_name, tensor in weights:
            name = self.hf_name(raw_name)
            if name is None or not self._on_this_stage(name):
                continue
            if name not in expected:
                unexpected.append(raw_name)
                continue
            param_name, shard_id = self._param_for(name)
            param = params[param_name]
            try:
                param.weight_loader(param, tensor, shard_id)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from e
            loaded.add(name)
        optional = {"lm_head.weight"} if self.config.tie_word_embeddings and self.lm_head is not None else set()
        missing = sorted(expected - loaded - optional)
        if unexpected or missing:
            raise ValueError(
                f"checkpoint does not match {type(self).__name__}: missing {missing}, unexpected {unexpected}"
            )

    def _on_this_stage(self, name: str) -> bool:
        """Whether this pipeline stage holds the tensor ``name`` (every stage holds every tensor without PP)."""
        model = self.model
        if name.startswith("model.layers."):
            return model.start_layer <= int(name.split(".")[2]) < model.end_layer
        if name.startswith("model.embed_tokens."):
            return model.embed_tokens is not None
        if name.startswith("model.norm."):
            return model.norm is not None
        return not name.startswith("lm_head.") or self.lm_head is not None

    def _expected_hf_names(self, params: dict[str, nn.Parameter]) -> set[str]:
        """HF names of every tensor we load; a fused parameter stands for each of its shards."""
        names = set()
        for name in params:
            module_name, _, param_name = name.rpartition(".")
            module = self.get_submodule(module_name)
            if isinstance(module, MergedLinear):
                prefix = module_name.rpartition(".")[0]
                names.update(f"{prefix}.{shard}.{param_name}" for shard in module.shard_rows)
            else:
                names.add(name)
        if self.config.tie_word_embeddings and self.lm_head is not None:
            names.add("lm_head.weight")  # tied: an alias of the embedding, loaded only if present
        return names

    def _param_for(self, name: str) -> tuple[str, str | None]:
        """Our parameter name and shard id for the HF tensor ``name``."""
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return "model.embed_tokens.weight", None
        prefix, _, param_name = name.rpartition(".")
        module_prefix, _, proj = prefix.rpartition(".")
        if proj in _FUSED_SHARDS:
            fused, shard_id = _FUSED_SHARDS[proj]
            return f"{module_prefix}.{fused}.{param_name}", shard_id
        return name, None
