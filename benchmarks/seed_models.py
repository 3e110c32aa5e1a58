"""The seed suite's four models, random weights in their published layouts: BGE-M3 (XLM-R large, CLS
pooling, normalized), pplx-embed-v1-0.6b (Qwen3-0.6B, bidirectional, mean pooling, int8 natively: its
PPLXQwen3Model folder as Perplexity ships it), bge-reranker-v2-m3 (an XLM-R large cross-encoder) and
Qwen3-Reranker-0.6B (the yes/no judge); with the real-size tokenizers of benchmarks/seed_tokenizers.py, or
in a smoke run tiny shapes and word tokenizers."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.checkpoints import (
    NUM_WORDS,
    QWEN3_SHAPES,
    QWEN3_SPECIALS,
    QWEN3_VOCAB_SIZE,
    Checkpoint,
    word_tokenizer,
    write_sentence_transformers,
)
from benchmarks.seed_tokenizers import QWEN3_BPE, XLMR_SPECIALS, XLMR_UNIGRAM, XLMR_VOCAB_SIZE, load

XLMR_SHAPES = {
    "xlmr-large": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                   "intermediate_size": 4096},
    "smoke": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
}  # fmt: skip
# as BAAI/bge-m3's and bge-reranker-v2-m3's config.json: a window of 8,192 after RoBERTa's two offsets
XLMR_SETTINGS = dict(
    max_position_embeddings=8194, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
    layer_norm_eps=1e-5,
)  # fmt: skip
# Qwen3-Reranker's chat tokens and the judge's answers, beside the BPE's own vocabulary
QWEN3_CHAT = ("<|im_start|>", "<|im_end|>")
# pplx-embed-v1's sentence-transformers quantizer module (its st_quantize.py), as its modules.json names it
PPLX_QUANTIZER = "st_quantize.FlexibleQuantizer"


@dataclass(frozen=True, slots=True)
class SeedModel:
    name: str  # as Perplexity's table names it
    kind: str  # "embedder" | "cross-encoder" | "judge"
    save: Callable[[Path, str, Path | None, str], Checkpoint]  # (folder, shape, tokenizers, device)
    shape: str  # its real size; "smoke" in a smoke run
    # what its users' timed requests ask for: float32 base64 (OpenAI's SDK), pplx-embed's int8 (Perplexity's)
    http_encoding: str = "base64"


def real_shape(smoke: bool, shape: str) -> str:
    return "smoke" if smoke else shape


def xlmr_tokenizer(tokenizers: Path | None):
    if tokenizers is None:
        return word_tokenizer(list(XLMR_SPECIALS), "<s> $A </s>", "<s> $A </s> </s> $B </s>", unk="<unk>")
    return load(tokenizers, XLMR_UNIGRAM)


def qwen3_tokenizer(tokenizers: Path | None, judge: bool = False):
    """The BPE with <|endoftext|> (pplx-embed-context's separator) and, for the judge, its chat tokens."""
    if tokenizers is None:
        return word_tokenizer(QWEN3_SPECIALS)
    tokenizer = load(tokenizers, QWEN3_BPE)
    if judge:
        tokenizer.add_special_tokens(list(QWEN3_CHAT))
    return tokenizer


def save_xlmr(folder: Path, shape: str, tokenizers: Path | None, device: str, kind: str) -> Checkpoint:
    """BGE-M3 (an embedder: CLS pooling, Normalize) or bge-reranker-v2-m3 (a one-logit cross-encoder)."""
    import transformers

    architecture = "XLMRobertaModel" if kind == "embedder" else "XLMRobertaForSequenceClassification"
    vocab_size = XLMR_VOCAB_SIZE if tokenizers is not None else NUM_WORDS + len(XLMR_SPECIALS)
    config = transformers.XLMRobertaConfig(
        vocab_size=vocab_size, num_labels=1, architectures=[architecture], **XLMR_SETTINGS,
        **XLMR_SHAPES[shape],
    )  # fmt: skip
    model = _made(getattr(transformers, architecture), config, device, folder)
    xlmr_tokenizer(tokenizers).save(str(folder / "tokenizer.json"))
    if kind == "embedder":
        write_sentence_transformers(folder, "cls")
    return Checkpoint(folder, kind, "xlm-roberta", shape, model, pooling="cls")


def save_pplx(folder: Path, shape: str, tokenizers: Path | None, device: str) -> Checkpoint:
    """pplx-embed-v1 as published: config.json of a PPLXQwen3Model (model_type bidirectional_pplx_qwen3,
    use_bidirectional_attention), weights without the `model.` prefix and no LM head, and the
    sentence-transformers modules Transformer, Pooling (mean) and its int8 quantizer."""
    import transformers

    vocab_size = QWEN3_VOCAB_SIZE if tokenizers is not None else NUM_WORDS + len(QWEN3_SPECIALS)
    config = transformers.Qwen3Config(
        vocab_size=vocab_size, max_position_embeddings=32768, tie_word_embeddings=True, use_cache=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **QWEN3_SHAPES[shape],
    )  # fmt: skip
    model = _made(transformers.Qwen3Model, config, device, folder)
    config_json = json.loads((folder / "config.json").read_text())
    config_json.update(
        architectures=["PPLXQwen3Model"], model_type="bidirectional_pplx_qwen3",
        use_bidirectional_attention=True,
        auto_map={"AutoConfig": "configuration.PPLXQwen3Config", "AutoModel": "modeling.PPLXQwen3Model"},
    )  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config_json, indent=2))
    qwen3_tokenizer(tokenizers).save(str(folder / "tokenizer.json"))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "", "type": PPLX_QUANTIZER, "kwargs": ["quantization"]},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": config.hidden_size, "pooling_mode_mean_tokens": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return Checkpoint(folder, "embedder", "pplx-qwen3", shape, model, pooling="mean", causal=False)


def save_qwen3_judge(folder: Path, shape: str, tokenizers: Path | None, device: str) -> Checkpoint:
    """Qwen3-Reranker as it ships: a bare causal LM with tied embeddings, no sentence-transformers files."""
    import transformers

    tokenizer = qwen3_tokenizer(tokenizers, judge=True)
    vocab_size = QWEN3_VOCAB_SIZE if tokenizers is not None else NUM_WORDS + len(QWEN3_SPECIALS)
    config = transformers.Qwen3Config(
        vocab_size=max(vocab_size, tokenizer.get_vocab_size()), max_position_embeddings=32768,
        tie_word_embeddings=True, architectures=["Qwen3ForCausalLM"], **QWEN3_SHAPES[shape],
    )  # fmt: skip
    model = _made(transformers.Qwen3ForCausalLM, config, device, folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    return Checkpoint(folder, "judge", "qwen3", shape, model, pooling="lasttoken")


def _made(architecture: Any, config: Any, device: str, folder: Path) -> Any:
    """`architecture` of `config`, initialized (seeded) on `device`, saved in float32; it comes back on the
    CPU as the fp32 reference."""
    import torch

    torch.manual_seed(0)
    with torch.device(device):
        model = architecture(config).eval()
    model.save_pretrained(folder)
    return model.to("cpu")


MODELS = (
    SeedModel("bge-m3", "embedder", lambda *args: save_xlmr(*args, kind="embedder"), "xlmr-large"),
    SeedModel("pplx-embed-v1-0.6b", "embedder", save_pplx, "qwen3-0.6b", "base64_int8"),
    SeedModel(
        "bge-reranker-v2-m3",
        "cross-encoder",
        lambda *args: save_xlmr(*args, kind="cross-encoder"),
        "xlmr-large",
    ),
    SeedModel("qwen3-reranker-0.6b", "judge", save_qwen3_judge, "qwen3-0.6b"),
)
BY_NAME = {model.name: model for model in MODELS}
