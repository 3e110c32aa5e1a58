"""Random-weight folders of more model families, as their hub checkpoints lay them out (config, tokenizer
template, sentence-transformers modules): all-mpnet-base-v2, gte-Qwen2-1.5B-instruct, EmbeddingGemma-300m,
a DeBERTa-v3-base embedder, each at its real size or a tiny smoke one. A layout is data; `save_layout`
writes any of them. Weights are transformers' own initialization (std 0.02), vocabularies real size."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.checkpoints import NUM_WORDS, Checkpoint, word_tokenizer, write_sentence_transformers

ENCODER = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
DECODER = (*ENCODER, "num_key_value_heads", "head_dim")
DENSE_STD = 0.02


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    config: str  # the transformers config class
    model: str  # the transformers class whose weights are saved
    architecture: str  # what config.json's `architectures` names (all-mpnet-base-v2's: a masked LM)
    vocab_size: int  # the real one (smoke shapes: the word tokenizer's)
    sizes: dict[str, dict[str, Any]]  # shape name -> config values that set its size
    specials: tuple[str, ...]  # the tokenizer's special tokens, by id
    unk: str
    template: str  # the tokenizer's post-processor for one text
    pooling: str  # sentence-transformers' pooling mode
    settings: dict[str, Any] = field(default_factory=dict)  # config values of every size
    dense_widths: tuple[int, ...] = ()  # Dense modules' output sizes, in multiples of hidden_size


def sizes(names: tuple[str, ...], shapes: dict[str, tuple[Any, ...]]) -> dict[str, dict[str, Any]]:
    return {shape: dict(zip(names, values)) for shape, values in shapes.items()}


def gemma3_layer_types(num_layers: int) -> list[str]:
    """Five sliding-window layers to one full-attention layer, as Gemma 3 has them."""
    return ["full_attention" if (index + 1) % 6 == 0 else "sliding_attention" for index in range(num_layers)]


MPNET = Layout(
    "mpnet", "MPNetConfig", "MPNetModel", "MPNetForMaskedLM", 30527,
    sizes(ENCODER, {"mpnet-base": (768, 12, 12, 3072), "smoke": (64, 2, 4, 128)}),
    ("<s>", "<pad>", "</s>", "<unk>"), "<unk>", "<s> $A </s>", "mean",
    dict(max_position_embeddings=514, relative_attention_num_buckets=32, pad_token_id=1, layer_norm_eps=1e-5),
)  # fmt: skip
QWEN2 = Layout(
    "qwen2", "Qwen2Config", "Qwen2Model", "Qwen2Model", 151646,
    sizes(DECODER, {"qwen2-1.5b": (1536, 28, 12, 8960, 2, 128), "smoke": (64, 2, 4, 96, 2, 16)}),
    ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|endoftext|>", "$A <|endoftext|>", "lasttoken",
    dict(max_position_embeddings=32768, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
         eos_token_id=0, pad_token_id=0),
)  # fmt: skip
GEMMA3 = Layout(
    "gemma3", "Gemma3TextConfig", "Gemma3TextModel", "Gemma3TextModel", 262144,
    {
        "gemma3-300m": {**dict(zip(DECODER, (768, 24, 3, 1152, 1, 256))), "sliding_window": 512,
                        "layer_types": gemma3_layer_types(24)},
        # a window shorter than the texts, and one full-attention layer
        "smoke": {**dict(zip(DECODER, (64, 2, 2, 128, 1, 256))), "sliding_window": 8,
                  "layer_types": ["sliding_attention", "full_attention"]},
    },
    ("<pad>", "<eos>", "<bos>", "<unk>"), "<unk>", "<bos> $A <eos>", "mean",
    dict(max_position_embeddings=2048, query_pre_attn_scalar=256, use_bidirectional_attention=True,
         hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=1, bos_token_id=2,
         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                          "full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
    dense_widths=(4, 1),
)  # fmt: skip
DEBERTA_V2 = Layout(
    "deberta-v2", "DebertaV2Config", "DebertaV2Model", "DebertaV2Model", 128100,
    sizes(ENCODER, {"deberta-v3-base": (768, 12, 12, 3072), "smoke": (64, 2, 4, 128)}),
    ("[PAD]", "[CLS]", "[SEP]", "[UNK]"), "[UNK]", "[CLS] $A [SEP]", "mean",
    dict(max_position_embeddings=512, relative_attention=True, position_buckets=256,
         norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
         position_biased_input=False, max_relative_positions=-1, layer_norm_eps=1e-7, type_vocab_size=0,
         pad_token_id=0),
)  # fmt: skip


def config_of(layout: Layout, shape: str) -> Any:
    """The transformers config of `layout` at `shape`."""
    import transformers

    vocab_size = NUM_WORDS + len(layout.specials) if shape == "smoke" else layout.vocab_size
    return getattr(transformers, layout.config)(
        vocab_size=vocab_size, architectures=[layout.architecture], **layout.settings, **layout.sizes[shape]
    )


def save_layout(
    folder: Path, shape: str, layout: Layout, device: str = "cpu", dtype: Any = None
) -> Checkpoint:
    """`layout` at `shape` ("smoke" or its real size), initialized on `device` (a 1.5B model takes
    seconds on the CPU, a blink on a GPU); weights stored in `dtype` (default float32, as made)."""
    import torch
    import transformers

    config = config_of(layout, shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, layout.model)(config).eval()
    state = {name: tensor.to("cpu", dtype or tensor.dtype) for name, tensor in model.state_dict().items()}
    model.save_pretrained(folder, state_dict=state)
    if layout.architecture != layout.model:  # save_pretrained names the saved class
        config_json = json.loads((folder / "config.json").read_text())
        config_json["architectures"] = [layout.architecture]
        (folder / "config.json").write_text(json.dumps(config_json, indent=2))
    word_tokenizer(list(layout.specials), layout.template, unk=layout.unk).save(
        str(folder / "tokenizer.json")
    )
    generator = torch.Generator().manual_seed(0)
    widths = [config.hidden_size, *(config.hidden_size * multiple for multiple in layout.dense_widths)]
    dense = tuple(
        torch.randn(out_features, in_features, generator=generator) * DENSE_STD
        for in_features, out_features in zip(widths, widths[1:])
    )
    write_sentence_transformers(folder, layout.pooling, dense)
    return Checkpoint(folder, "embedder", layout.name, shape, model, pooling=layout.pooling, dense=dense)
