"""Random-weight model folders for the suites: real-size shapes (MiniLM, BERT-base, Qwen3-0.6B) or tiny
smoke ones, each with a word-level tokenizer on which a text of n words is n tokens, so that the suites
control token counts exactly."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# hidden size, layers, heads, intermediate size
BERT_SIZES = {
    "minilm": (384, 6, 12, 1536), "bert-base": (768, 12, 12, 3072), "smoke": (64, 2, 4, 128),
    "bert-large": (1024, 24, 16, 4096),  # XLM-R large's transformer (BGE-M3, bge-reranker-v2-m3): profile
}  # fmt: skip
BERT_SHAPES = {
    name: dict(zip(("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"), sizes))
    for name, sizes in BERT_SIZES.items()
}
QWEN3_SHAPES = {
    "qwen3-0.6b": {
        "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 3072,
    },
    "smoke": {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 96,
    },
}  # fmt: skip
NUM_WORDS = 8000  # the tokenizer's words w0..w7999; the configs keep their real vocabulary sizes
BERT_VOCAB_SIZE = 30522
QWEN3_VOCAB_SIZE = 151669
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
QWEN3_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "no", "yes"]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    folder: Path
    kind: str  # "embedder" | "cross-encoder" | "judge"
    family: str  # "bert" | "qwen3" | a layout of benchmarks/layouts.py
    shape: str
    reference: Any  # the transformers model in float32 (on the CPU unless it was made elsewhere)
    pooling: str = "mean"  # an embedder's sentence-transformers pooling mode: "mean" | "lasttoken" | "cls"
    # its Dense modules' weights, in order ([out, in], float32; no bias, identity activation)
    dense: tuple[Any, ...] = ()
    causal: bool = True  # a decoder's attention; False: bidirectional (pplx-embed)


def words(num_words: int, rng: random.Random) -> str:
    """A text of exactly `num_words` tokens (before special tokens) for these tokenizers."""
    return " ".join(f"w{rng.randrange(NUM_WORDS)}" for _ in range(num_words))


def word_tokenizer(
    specials: list[str], single: str | None = None, pair: str | None = None, unk: str | None = None
):
    """Specials first, then the words; `single` / `pair`: a post-processor template of specials; `unk`:
    the unknown token (by default "[UNK]" after "[PAD]", else the first special)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    vocab = {token: index for index, token in enumerate(specials)}
    vocab.update({f"w{index}": len(specials) + index for index in range(NUM_WORDS)})
    unk = unk or (specials[1] if specials[0] == "[PAD]" else specials[0])
    tokenizer = Tokenizer(WordLevel(vocab, unk_token=unk))
    tokenizer.pre_tokenizer = Whitespace()
    for token in specials:  # so "<|im_start|>" in a prompt is one token, not split by the pre-tokenizer
        tokenizer.add_special_tokens([token])
    if single is not None:
        used = set(single.split()) | set((pair or "").split())
        tokens = [(token, vocab[token]) for token in specials if token in used or f"{token}:1" in used]
        tokenizer.post_processor = TemplateProcessing(single=single, pair=pair, special_tokens=tokens)
    return tokenizer


def write_sentence_transformers(folder: Path, pooling_mode: str, dense: tuple[Any, ...] = ()) -> None:
    """modules.json: the Transformer, Pooling, a Dense module per weight in `dense` (no bias, identity
    activation, as EmbeddingGemma's), Normalize."""
    from safetensors.torch import save_file

    dense_paths = [f"{2 + index}_Dense" for index in range(len(dense))]
    paths = ["", "1_Pooling", *dense_paths, f"{2 + len(dense)}_Normalize"]
    kinds = ["Transformer", "Pooling", *("Dense" for _ in dense), "Normalize"]
    modules = [
        {"idx": index, "name": str(index), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for index, (path, kind) in enumerate(zip(paths, kinds))
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": pooling_mode}))
    for path, weight in zip(dense_paths, dense):
        out_features, in_features = weight.shape
        config = {"in_features": in_features, "out_features": out_features, "bias": False}
        config["activation_function"] = "torch.nn.modules.linear.Identity"
        (folder / path).mkdir(exist_ok=True)
        (folder / path / "config.json").write_text(json.dumps(config))
        save_file({"linear.weight": weight.contiguous()}, folder / path / "model.safetensors")


def save_bert(folder: Path, shape: str, kind: str = "embedder", num_labels: int = 1) -> Checkpoint:
    """A BERT embedder (mean pooling, normalized, like bge / MiniLM) or a one-logit cross-encoder."""
    import torch
    import transformers

    architecture = "BertModel" if kind == "embedder" else "BertForSequenceClassification"
    config = transformers.BertConfig(
        vocab_size=BERT_VOCAB_SIZE if shape != "smoke" else NUM_WORDS + len(BERT_SPECIALS),
        max_position_embeddings=512, num_labels=num_labels, architectures=[architecture],
        **BERT_SHAPES[shape],
    )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).eval()
    model.save_pretrained(folder)
    tokenizer = word_tokenizer(BERT_SPECIALS, "[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1")
    tokenizer.save(str(folder / "tokenizer.json"))
    if kind == "embedder":
        write_sentence_transformers(folder, "mean")
    return Checkpoint(folder, kind, "bert", shape, model)


def save_qwen3(folder: Path, shape: str, kind: str = "embedder") -> Checkpoint:
    """Qwen3-Embedding (causal, last token after <|endoftext|>, normalized) or Qwen3-Reranker (the
    yes/no judge: a causal LM with tied embeddings, no sentence-transformers files)."""
    import torch
    import transformers

    architecture = "Qwen3Model" if kind == "embedder" else "Qwen3ForCausalLM"
    config = transformers.Qwen3Config(
        vocab_size=QWEN3_VOCAB_SIZE if shape != "smoke" else NUM_WORDS + len(QWEN3_SPECIALS),
        max_position_embeddings=32768, tie_word_embeddings=True, architectures=[architecture],
        **QWEN3_SHAPES[shape],
    )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).eval()
    model.save_pretrained(folder)
    # Qwen3-Embedding's tokenizer appends <|endoftext|>; Qwen3-Reranker's adds nothing
    if kind == "embedder":
        tokenizer = word_tokenizer(QWEN3_SPECIALS, "$A <|endoftext|>", "$A <|endoftext|> $B <|endoftext|>")
    else:
        tokenizer = word_tokenizer(QWEN3_SPECIALS)
    tokenizer.save(str(folder / "tokenizer.json"))
    if kind == "embedder":
        write_sentence_transformers(folder, "lasttoken")
    return Checkpoint(folder, kind, "qwen3", shape, model, pooling="lasttoken")
