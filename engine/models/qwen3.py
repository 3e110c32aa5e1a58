"""Packed Qwen3: causal with last-token pooling (Qwen3-Embedding), bidirectional with mean pooling
(pplx-embed-style), or the yes/no judge of Qwen3-Reranker scored from two rows of the LM head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, varlen_attention
from engine.batch import PackedBatch
from engine.errors import UnsupportedModel
from engine.layers.pooling import Pooler, last_pool
from engine.layers.qk_norm_rotary import QKNormRotary
from engine.layers.rms_norm import AddRMSNorm, rms_norm
from engine.layers.rotary import rope_theta, rotary_tables
from engine.layers.swiglu import silu_and_mul

if TYPE_CHECKING:
    from engine.loader import ModelSpec, WeightTargets

JUDGE_TOKENS = ("no", "yes")  # the judge's two logits, in the order softmax's positive class expects


@dataclass(frozen=True, slots=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    tie_word_embeddings: bool
    causal: bool

    @classmethod
    def from_hf(cls, hf_config: Any, causal: bool) -> Qwen3Config:
        if getattr(hf_config, "use_sliding_window", False):
            raise UnsupportedModel("Qwen3 with sliding-window layers is not supported")
        if hf_config.hidden_act not in ("silu", "swish"):
            raise UnsupportedModel(f"Qwen3 with hidden_act {hf_config.hidden_act!r} is not supported")
        num_heads = hf_config.num_attention_heads
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads,
            intermediate_size=hf_config.intermediate_size,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope_theta=rope_theta(hf_config),
            attention_bias=bool(getattr(hf_config, "attention_bias", False)),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            causal=causal,
        )


class Qwen3Attention(nn.Module):
    """Fused QKV projection, per-head RMSNorm of queries and keys with rotary (one kernel on CUDA),
    grouped-query attention."""

    def __init__(self, config: Qwen3Config, attention_backend: AttentionBackend):
        super().__init__()
        self.causal = config.causal
        self.attention_backend = attention_backend
        qkv_size = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
        self.qkv = nn.Linear(config.hidden_size, qkv_size, bias=config.attention_bias)
        self.qk_norm_rotary = QKNormRotary(
            config.num_heads, config.num_kv_heads, config.head_dim, config.rms_norm_eps
        )
        out_size = config.num_heads * config.head_dim
        self.out = nn.Linear(out_size, config.hidden_size, bias=config.attention_bias)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_tokens, hidden]
        num_tokens = hidden.shape[0]
        q, k, v = self.qk_norm_rotary(self.qkv(hidden), cos, sin)
        attention = varlen_attention(q, k, v, meta, backend=self.attention_backend, causal=self.causal)
        return self.out(attention.reshape(num_tokens, -1))


class Qwen3MLP(nn.Module):
    """SwiGLU: gate and up projections as one GEMM, SiLU(gate) * up as one kernel on CUDA."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # [num_tokens, hidden] -> [num_tokens, hidden]
        return self.down(silu_and_mul(self.gate_up(hidden)))


class Qwen3Layer(nn.Module):
    """Pre-norm block; each norm also adds the residual stream, which it hands on."""

    def __init__(self, config: Qwen3Config, attention_backend: AttentionBackend):
        super().__init__()
        self.attention_norm = AddRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Qwen3Attention(config, attention_backend)
        self.mlp_norm = AddRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # [num_tokens, hidden] output of the last block and residual stream (None before the first
        # block) -> the same for this block
        hidden, residual = self.attention_norm(hidden, residual)
        hidden, residual = self.mlp_norm(self.attention(hidden, cos, sin, meta), residual)
        return self.mlp(hidden), residual


class Qwen3Encoder(nn.Module):
    """Embeddings, layers and the final norm; subclasses pool. The checkpoint name map lives here."""

    checkpoint_prefixes = ("model.",)
    ignored_weights: tuple[str, ...] = ("lm_head.",)

    def __init__(self, config: Qwen3Config, attention_backend: AttentionBackend):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3Layer(config, attention_backend) for _ in range(config.num_layers))
        self.norm = AddRMSNorm(config.hidden_size, config.rms_norm_eps)

    def encode(self, batch: PackedBatch, meta: AttentionMetadata) -> torch.Tensor:
        # PackedBatch of num_tokens -> [num_tokens, hidden], before the final norm (the residual stream)
        hidden = self.embed_tokens(batch.input_ids)
        cos, sin = rotary_tables(batch.positions, self.config.head_dim, self.config.rope_theta, hidden.dtype)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos, sin, meta)
        return hidden + residual

    def final_norm(self, stream: torch.Tensor) -> torch.Tensor:
        # [n, hidden] -> [n, hidden]; row-wise, so pooling one row per sequence first gives the same rows
        return rms_norm(stream, self.norm.weight, self.norm.eps)

    def weight_map(self) -> WeightTargets:
        """Every checkpoint tensor the model needs -> where it goes."""
        config = self.config
        targets: WeightTargets = {
            "embed_tokens.weight": ("embed_tokens.weight", None),
            "norm.weight": ("norm.weight", None),
        }
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        shards = {"q_proj": slice(0, q_size), "k_proj": slice(q_size, q_size + kv_size)}
        shards["v_proj"] = slice(q_size + kv_size, q_size + 2 * kv_size)
        gate_up = {"gate_proj": slice(0, config.intermediate_size)}
        gate_up["up_proj"] = slice(config.intermediate_size, 2 * config.intermediate_size)
        for index in range(config.num_layers):
            source, target = f"layers.{index}.", f"layers.{index}."
            names = {
                "input_layernorm.weight": "attention_norm.weight",
                "post_attention_layernorm.weight": "mlp_norm.weight",
                "self_attn.q_norm.weight": "attention.qk_norm_rotary.q_norm.weight",
                "self_attn.k_norm.weight": "attention.qk_norm_rotary.k_norm.weight",
                "self_attn.o_proj.weight": "attention.out.weight",
                "mlp.down_proj.weight": "mlp.down.weight",
            }
            for checkpoint_name, parameter in names.items():
                targets[source + checkpoint_name] = (target + parameter, None)
            leaves = ("weight", "bias") if config.attention_bias else ("weight",)
            for leaf in leaves:
                for projection, rows in shards.items():
                    qkv = f"{target}attention.qkv.{leaf}"
                    targets[f"{source}self_attn.{projection}.{leaf}"] = (qkv, rows)
            if config.attention_bias:
                targets[f"{source}self_attn.o_proj.bias"] = (f"{target}attention.out.bias", None)
            for projection, rows in gate_up.items():
                targets[f"{source}mlp.{projection}.weight"] = (f"{target}mlp.gate_up.weight", rows)
        return targets


class Qwen3Embedder(Qwen3Encoder):
    """Qwen3Model: pooled (last token when causal, as Qwen3-Embedding; mean when bidirectional),
    normalized as the model's files say, float32 vectors."""

    def __init__(self, config: Qwen3Config, attention_backend: AttentionBackend, pooler: Pooler):
        super().__init__(config, attention_backend)
        self.pooler = pooler

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> Qwen3Embedder:
        config = Qwen3Config.from_hf(spec.hf_config, causal=not spec.bidirectional)
        return cls(config, attention_backend, Pooler(spec.pooling, spec.normalize))

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, hidden] float32
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        stream = self.encode(batch, meta)
        if self.pooler.method == "mean":
            return self.pooler(self.final_norm(stream), meta)
        return self.pooler.finish(self.final_norm(self.pooler.pool(stream, meta)))


class Qwen3Judge(Qwen3Encoder):
    """Qwen3ForCausalLM as a reranker: the logits of "no" and "yes" at each sequence's last token,
    from those two rows of the LM head only (never the vocabulary-wide projection)."""

    def __init__(
        self, config: Qwen3Config, attention_backend: AttentionBackend, judge_token_ids: tuple[int, int]
    ):
        super().__init__(config, attention_backend)
        self.judge_token_ids = judge_token_ids
        self.judge = nn.Linear(config.hidden_size, len(judge_token_ids), bias=False)
        # a tied head is the embedding table: a copy of it that a checkpoint may still carry is not read
        self.ignored_weights = ("lm_head.",) if config.tie_word_embeddings else ()

    @classmethod
    def from_spec(cls, spec: ModelSpec, attention_backend: AttentionBackend) -> Qwen3Judge:
        return cls(Qwen3Config.from_hf(spec.hf_config, causal=True), attention_backend, judge_token_ids(spec))

    def forward(self, batch: PackedBatch, meta: AttentionMetadata | None = None) -> torch.Tensor:
        # PackedBatch of num_seqs sequences -> [num_seqs, 2] float32 logits of ("no", "yes")
        if meta is None:
            meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        return self.judge(self.final_norm(last_pool(self.encode(batch, meta), meta))).float()

    def weight_map(self) -> WeightTargets:
        targets = super().weight_map()
        judge_rows = ("judge.weight", None, self.judge_token_ids)
        if self.config.tie_word_embeddings:
            targets["embed_tokens.weight"] = [targets["embed_tokens.weight"], judge_rows]
        else:
            targets["lm_head.weight"] = judge_rows
        return targets


def judge_token_ids(spec: ModelSpec) -> tuple[int, int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    ids = tuple(tokenizer.token_to_id(token) for token in JUDGE_TOKENS)
    if None in ids:
        raise UnsupportedModel(f"model {spec.name!r}: its tokenizer has no single tokens {JUDGE_TOKENS}")
    return ids  # type: ignore[return-value]
