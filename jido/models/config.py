"""The architecture description our model code is built from, read from an HF ``config.json`` dict."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jido.layers.rotary import RopeScaling
from jido.models.registry import canonical_architecture, supported_architectures
from jido.utils.hf_config import layer_sliding_windows, text_config

# Values transformers' config classes use when a config.json leaves the key out.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {"rope_theta": 10_000.0, "tie_word_embeddings": False, "rms_norm_eps": 1e-6},
    "Qwen2ForCausalLM": {"rope_theta": 10_000.0, "tie_word_embeddings": False, "rms_norm_eps": 1e-6},
    "Qwen3ForCausalLM": {"rope_theta": 10_000.0, "tie_word_embeddings": False, "rms_norm_eps": 1e-6},
    "Qwen3MoeForCausalLM": {"rope_theta": 10_000.0, "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
                            "decoder_sparse_step": 1, "norm_topk_prob": False, "mlp_only_layers": []},
    "Gemma3ForCausalLM": {
        "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
        "sliding_window": 4096, "sliding_window_pattern": 6, "vocab_size": 262_208, "head_dim": 256,
        "max_position_embeddings": 131_072,
    },
}
_QK_NORM = {"Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM"}


@dataclass(frozen=True)
class ModelArchConfig:
    """Everything the model code needs to know about an architecture; shapes, RoPE, windows, caps.

    ``sliding_windows`` holds one entry per layer: the window of a sliding layer (a query at ``p`` sees
    keys ``p - w < k <= p``) or ``None`` for a global one; left empty, every layer is global.
    ``rope_local_theta`` is Gemma 3's RoPE base for its sliding layers (``None``: same RoPE everywhere);
    ``rope_scaling`` applies to the global layers only, as in transformers.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    rope_local_theta: float | None = None
    rope_scaling: RopeScaling | None = None
    sliding_windows: tuple[int | None, ...] = ()
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    query_pre_attn_scalar: float | None = None
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    max_position_embeddings: int = 8192
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Mixture of experts (0 experts: a dense model): a layer is sparse unless listed in ``mlp_only_layers`` or off
    # the ``decoder_sparse_step`` beat; each token runs ``num_experts_per_tok`` experts of width moe_intermediate_size.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.architecture not in supported_architectures():
            raise ValueError(f"unsupported architecture {self.architecture!r}; supported: {supported_architectures()}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not self.sliding_windows:
            object.__setattr__(self, "sliding_windows", (None,) * self.num_layers)
        if len(self.sliding_windows) != self.num_layers:
            raise ValueError(f"sliding_windows has {len(self.sliding_windows)} entries for {self.num_layers} layers")
        if any(w is not None and w < 1 for w in self.sliding_windows):
            raise ValueError(f"sliding windows must be >= 1 or None, got {self.sliding_windows}")

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` has a mixture of experts instead of a dense MLP (transformers' rule)."""
        return (self.num_experts > 0 and layer_idx not in self.mlp_only_layers
                and (layer_idx + 1) % self.decoder_sparse_step == 0)

    @property
    def attn_scale(self) -> float:
        """Softmax scale: ``query_pre_attn_scalar ** -0.5`` (Gemma) or ``head_dim ** -0.5``."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def layer_rope(self, layer_idx: int) -> tuple[float, RopeScaling | None]:
        """RoPE base and scaling of one layer (Gemma 3's sliding layers use their own, unscaled base)."""
        if self.sliding_windows[layer_idx] is not None and self.rope_local_theta is not None:
            return self.rope_local_theta, None
        return self.rope_theta, self.rope_scaling

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelArchConfig:
        """Read an HF ``config.json`` dict (transformers 4 or 5 layout).

        Raises:
            ValueError: the architecture or its RoPE scaling is not supported, or a value is out of range.
        """
        arch = canonical_architecture((cfg.get("architectures") or [None])[0])
        # Multimodal Gemma 3 checkpoints nest the text model's settings; top-level ids still apply.
        text = text_config(cfg)
        hf = {**_FAMILY_DEFAULTS[arch], **{k: v for k, v in text.items() if v is not None}}
        num_heads = hf["num_attention_heads"]
        rope_theta, rope_local_theta, rope_scaling = _read_rope(hf, arch)
        return cls(
            architecture=arch,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads", num_heads),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            rms_norm_eps=hf["rms_norm_eps"],
            rope_theta=rope_theta,
            rope_local_theta=rope_local_theta,
            rope_scaling=rope_scaling,
            sliding_windows=layer_sliding_windows(hf),
            tie_word_embeddings=hf["tie_word_embeddings"],
            hidden_act=hf.get("hidden_activation") or hf.get("hidden_act", "silu"),
            # Qwen2 always has q/k/v biases and never an o_proj bias; the others follow attention_bias.
            qkv_bias=arch == "Qwen2ForCausalLM" or hf.get("attention_bias", False),
            o_bias=arch != "Qwen2ForCausalLM" and hf.get("attention_bias", False),
            qk_norm=arch in _QK_NORM,
            query_pre_attn_scalar=hf.get("query_pre_attn_scalar"),
            final_logit_softcapping=hf.get("final_logit_softcapping"),
            attn_logit_softcapping=hf.get("attn_logit_softcapping"),
            max_position_embeddings=hf.get("max_position_embeddings", 8192),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=_as_tuple(hf.get("eos_token_id")),
            num_experts=hf.get("num_experts") or hf.get("num_local_experts", 0),  # Qwen3-MoE, transformers 5
            num_experts_per_tok=hf.get("num_experts_per_tok", 0),
            moe_intermediate_size=hf.get("moe_intermediate_size", 0),
            norm_topk_prob=hf.get("norm_topk_prob", False),
            decoder_sparse_step=hf.get("decoder_sparse_step", 1),
            mlp_only_layers=tuple(hf.get("mlp_only_layers", ())),
        )


def _as_tuple(ids: int | list[int] | None) -> tuple[int, ...]:
    if ids is None:
        return ()
    return tuple(ids) if isinstance(ids, list) else (ids,)


def _read_rope(hf: dict[str, Any], arch: str) -> tuple[float, float | None, RopeScaling | None]:
    """(global theta, local theta or None, global scaling) from either transformers layout."""
    params = hf.get("rope_parameters")
    local_theta = hf.get("rope_local_base_freq") if arch == "Gemma3ForCausalLM" else None
    if isinstance(params, dict) and "full_attention" in params:
        # transformers 5, per layer type (Gemma 3): {"full_attention": {...}, "sliding_attention": {...}}
        local = params.get("sliding_attention") or {}
        if _read_scaling(local) is not None:
            raise ValueError(f"RoPE scaling on sliding layers is not supported: {local}")
        global_params = params["full_attention"]
        theta = global_params.get("rope_theta", hf["rope_theta"])
        return theta, local.get("rope_theta", local_theta), _read_scaling(global_params)
    if isinstance(params, dict):
        return params.get("rope_theta", hf["rope_theta"]), local_theta, _read_scaling(params)
    return hf["rope_theta"], local_theta, _read_scaling(hf.get("rope_scaling") or {})


def _read_scaling(params: dict[str, Any]) -> RopeScaling | None:
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "default":
        return None
    if rope_type not in ("linear", "llama3"):
        raise ValueError(f"unsupported rope scaling type {rope_type!r}; supported: 'default', 'linear', 'llama3'")
    return RopeScaling(
        rope_type=rope_type,
        factor=float(params["factor"]),
        low_freq_factor=params.get("low_freq_factor"),
        high_freq_factor=params.get("high_freq_factor"),
        original_max_position_embeddings=params.get("original_max_position_embeddings"),
    )
