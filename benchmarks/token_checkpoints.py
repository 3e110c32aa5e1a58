"""Random checkpoints of the token-level model layouts (tiny for the tests, real-size for the tokens suite),
built with the MiniLM tokenizer (no hub):
ColBERT as colbert-ai saves it and as PyLate does (same weights), SPLADE as sentence-transformers'
SparseEncoder saves it, and bge-m3 (an XLM-RoBERTa encoder with colbert_linear.pt and sparse_linear.pt).
Every parameter is random, norms and biases too, so that parity can fail. Also the reference packages'
loaders where they need a word with today's transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
COLBERT_DIM = 16
QUERY_LENGTH, DOCUMENT_LENGTH = 12, 24


# the CPU tests' shape; the GPU tests' has head dim 64, which every attention backend takes; the tokens
# suite's are the real models'
TINY = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64}
TINY_HEAD_DIM_64 = {"hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 256}
BERT_BASE = {
    "hidden_size": 768,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "max_position_embeddings": 512,
}
XLM_ROBERTA_LARGE = {
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "max_position_embeddings": 8194,
}


def tiny_bert_config(minilm: Path, model_type: str = "bert", architecture: str = "BertModel", shape=TINY):
    from transformers import AutoConfig

    vocab_size = json.loads((minilm / "config.json").read_text())["vocab_size"]
    settings = {"num_hidden_layers": 2, "max_position_embeddings": 128, **shape}
    return AutoConfig.for_model(
        model_type, vocab_size=vocab_size, architectures=[architecture], pad_token_id=0, **settings
    )


# the tests' noise; a real-size model at that scale is chaotic (a bf16 rounding moves a 28-layer Qwen3's
# outputs to cosine 0.88), so the tokens suite's real sizes take trained weights' scale instead
NOISE_STD = 0.2
REAL_SIZE_STD = 0.04


def randomized(model: torch.nn.Module, seed: int, std: float = NOISE_STD) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * std
            is_norm_scale = "LayerNorm.weight" in name or "layer_norm.weight" in name
            parameter.copy_(1 + noise if is_norm_scale else noise)
    return model.eval()


def copy_tokenizer(minilm: Path, folder: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, folder / name)


def colbert_checkpoints(
    minilm: Path,
    root: Path,
    seed: int = 0,
    shape=TINY,
    dim: int = COLBERT_DIM,
    lengths: tuple[int, int] = (QUERY_LENGTH, DOCUMENT_LENGTH),
    modernbert: bool = False,
    std: float = NOISE_STD,
) -> tuple[Path, Path]:
    """(colbert-ai folder, PyLate folder) of one random BERT ColBERT with a `dim`-wide projection and the
    query and document `lengths` (the tests': 16, 12 and 24); `modernbert`: a ModernBERT one (as
    GTE-ModernColBERT), with 8-token local attention windows, shorter than a query."""
    from safetensors.torch import save_file
    from transformers import BertModel

    bert = randomized(
        tiny_modernbert(minilm) if modernbert else BertModel(tiny_bert_config(minilm, shape=shape)), seed, std
    )
    prefix = bert.base_model_prefix
    generator = torch.Generator().manual_seed(seed + 1)
    linear = torch.randn(dim, bert.config.hidden_size, generator=generator) * 0.3
    state = {name: tensor.contiguous() for name, tensor in bert.state_dict().items()}

    colbert_ai = root / "colbert-ai"
    colbert_ai.mkdir(parents=True)
    config = bert.config.to_dict() | {"architectures": ["HF_ColBERT"]}
    (colbert_ai / "config.json").write_text(json.dumps(config))
    copy_tokenizer(minilm, colbert_ai)
    save_file({**{f"{prefix}.{name}": t for name, t in state.items()}, "linear.weight": linear},
              str(colbert_ai / "model.safetensors"))  # fmt: skip
    metadata = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": lengths[0],
                "doc_maxlen": lengths[1], "dim": dim, "mask_punctuation": True,
                "attend_to_mask_tokens": False, "similarity": "cosine"}  # fmt: skip
    (colbert_ai / "artifact.metadata").write_text(json.dumps(metadata))

    pylate = root / "pylate"
    (pylate / "1_Dense").mkdir(parents=True)
    bert.save_pretrained(pylate)
    copy_tokenizer(minilm, pylate)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ]
    (pylate / "modules.json").write_text(json.dumps(modules))
    settings = {"query_prefix": "[unused0]", "document_prefix": "[unused1]", "query_length": lengths[0],
                "document_length": lengths[1], "attend_to_expansion_tokens": False,
                "do_query_expansion": True, "similarity_fn_name": "MaxSim"}  # fmt: skip
    (pylate / "config_sentence_transformers.json").write_text(json.dumps(settings))
    (pylate / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": lengths[1] - 1}))
    dense = {"in_features": bert.config.hidden_size, "out_features": dim, "bias": False,
             "activation_function": "torch.nn.modules.linear.Identity"}  # fmt: skip
    (pylate / "1_Dense" / "config.json").write_text(json.dumps(dense))
    save_file({"linear.weight": linear.clone()}, str(pylate / "1_Dense" / "model.safetensors"))
    return colbert_ai, pylate


def tiny_modernbert(minilm: Path):
    from transformers import ModernBertConfig, ModernBertModel

    vocab_size = json.loads((minilm / "config.json").read_text())["vocab_size"]
    config = ModernBertConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, global_attn_every_n_layers=2, local_attention=8,
        max_position_embeddings=128, pad_token_id=0, cls_token_id=101, sep_token_id=102,
        bos_token_id=101, eos_token_id=102, architectures=["ModernBertModel"],
    )  # fmt: skip
    return ModernBertModel(config)


def colbert_ai_checkpoint(folder: Path):
    """colbert-ai's Checkpoint of a folder, on the CPU. colbert-ai 0.2.22 builds its HF_ColBERT without
    transformers 5's bookkeeping: the class it makes gets what transformers reads of it."""
    from colbert.infra.config import ColBERTConfig
    from colbert.modeling import base_colbert, hf_colbert
    from colbert.modeling.colbert import ColBERT

    # its C++ MaxSim extension scores training and index-search batches, which neither the tests nor the
    # tokens suite call; compiling it took 50 s in each new environment (CI): marked loaded, it is not built
    ColBERT.loaded_extensions = True
    made = hf_colbert.class_factory

    def class_factory(name_or_path):
        model_class = made(name_or_path)
        model_class.all_tied_weights_keys = {}
        model_class._keys_to_ignore_on_load_unexpected = {r"cls"}
        model_class.init_weights = lambda self: None  # from_pretrained loads every weight
        return model_class

    base_colbert.class_factory = class_factory
    try:
        from colbert.modeling.checkpoint import Checkpoint

        return Checkpoint(str(folder), colbert_config=ColBERTConfig(gpus=0)).eval()
    finally:
        base_colbert.class_factory = made


def splade_checkpoint(
    minilm: Path,
    folder: Path,
    seed: int = 0,
    pooling: str = "max",
    shape=TINY,
    activation: str = "relu",
    family: str = "bert",
    std: float = NOISE_STD,
) -> Path:
    """A random *ForMaskedLM of the BERT `family` (bert, roberta, distilbert) saved as a
    sentence-transformers SparseEncoder (MLMTransformer, SpladePooling)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling
    from transformers import AutoConfig, AutoModelForMaskedLM

    source = folder.parent / f"{folder.name}-mlm"
    if family == "distilbert":  # DistilBERT names its sizes otherwise
        vocab_size = json.loads((minilm / "config.json").read_text())["vocab_size"]
        config = AutoConfig.for_model(
            "distilbert", vocab_size=vocab_size, dim=shape["hidden_size"], n_layers=2,
            hidden_dim=shape["intermediate_size"], n_heads=shape["num_attention_heads"],
            max_position_embeddings=128, pad_token_id=0,
            architectures=["DistilBertForMaskedLM"],
        )  # fmt: skip
    else:
        architecture = {"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM"}[family]
        config = tiny_bert_config(minilm, family, architecture, shape=shape)
    model = randomized(AutoModelForMaskedLM.from_config(config), seed, std)
    model.save_pretrained(source)
    copy_tokenizer(minilm, source)
    modules = [MLMTransformer(str(source)), SpladePooling(pooling, activation_function=activation)]
    encoder = SparseEncoder(modules=modules, device="cpu")
    encoder.save(str(folder))
    return folder


def m3_checkpoint(minilm: Path, folder: Path, seed: int = 0, shape=TINY, std: float = NOISE_STD) -> Path:
    """bge-m3's layout over a random XLM-RoBERTa encoder: the sentence-transformers dense model ([CLS],
    normalized) beside colbert_linear.pt and sparse_linear.pt."""
    from transformers import XLMRobertaModel

    config = tiny_bert_config(minilm, "xlm-roberta", "XLMRobertaModel", shape)
    model = randomized(XLMRobertaModel(config), seed, std)
    model.save_pretrained(folder)
    copy_tokenizer(minilm, folder)
    hidden = model.config.hidden_size
    generator = torch.Generator().manual_seed(seed + 1)
    # a positive lexical bias, so that most tokens weigh more than zero
    for name, outputs, bias in (("colbert_linear", hidden, 0.0), ("sparse_linear", 1, 1.0)):
        weights = {"weight": torch.randn(outputs, hidden, generator=generator) * 0.3,
                   "bias": torch.randn(outputs, generator=generator) * 0.1 + bias}  # fmt: skip
        torch.save(weights, folder / f"{name}.pt")
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": hidden, "pooling_mode": "cls"})
    )
    (folder / "2_Normalize").mkdir()
    # bge-m3's window: its positions past RoBERTa's offset of 2 (8,192 at the real size, 126 in the tests)
    window = config.max_position_embeddings - 2
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": window}))
    return folder


def flag_m3_embedder(folder: Path):
    """FlagEmbedding's BGEM3FlagModel (M3Embedder) of a folder, on the CPU in float32. FlagEmbedding's
    package __init__ imports every model it has, and one (a MiniCPM reranker) fails on transformers 5;
    the bge-m3 embedder's own modules import as they are."""
    import importlib.util
    import os
    import sys
    import types

    loaded = sys.modules.get("FlagEmbedding")  # a call before this one put the package in place
    root = (
        loaded.__path__[0]
        if loaded is not None
        else os.path.dirname(importlib.util.find_spec("FlagEmbedding").origin)
    )
    for name in ("FlagEmbedding", "FlagEmbedding.inference", "FlagEmbedding.inference.embedder",
                 "FlagEmbedding.finetune", "FlagEmbedding.finetune.embedder"):  # fmt: skip
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(root, *name.split(".")[1:])]
            sys.modules[name] = package
    from FlagEmbedding.inference.embedder.encoder_only.m3 import M3Embedder

    return M3Embedder(str(folder), use_fp16=False, devices="cpu", normalize_embeddings=True)


# a listwise ranker's corpus for its tokenizer: the prompt's own words and the tests' texts
LISTWISE_CORPUS = (
    "You are a search relevance expert who can determine a ranking of the passages based on how relevant "
    "they are to the query. If the query is a question, how relevant a passage is depends on how well it "
    "answers the question. If not, try to analyze the intent of the query and assess how well each passage "
    "satisfies the intent. If an instruction is provided, you should follow the instruction when "
    "determining the ranking. I will provide you with 12 passages, each indicated by a numerical identifier."
    ' Rank the passages based on their relevance to query: <passage id="0"> </passage> <query> </query> '
    "<instruct> </instruct> <think> </think> 0 1 2 3 4 5 6 7 8 9 cats eat fish mostly trains run on rails "
    "what do dogs like? Paris is the capital of France. The weather is cold today, and rain is coming."
)
LISTWISE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|embed_token|>", "<|rerank_token|>"]
TINY_QWEN3 = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
}


def byte_level_tokenizer(vocab_size: int = 400):
    """A byte-level BPE tokenizer (Qwen's kind: spaces and newlines are bytes of the tokens) trained on
    LISTWISE_CORPUS, with Qwen's special tokens and the listwise markers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=LISTWISE_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([LISTWISE_CORPUS], trainer)
    return tokenizer


def listwise_checkpoint(
    folder: Path,
    seed: int = 0,
    shape=TINY_QWEN3,
    max_position_embeddings: int = 2048,
    std: float = NOISE_STD,
) -> Path:
    """jina-reranker-v3's layout: a Qwen3 model under `model.`, an LM head (unread), and the projector
    (hidden -> hidden / 2 -> 512, no biases), config architecture JinaForRanking."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3Model

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = byte_level_tokenizer()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = Qwen3Config(
        vocab_size=tokenizer.get_vocab_size(),
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        architectures=["JinaForRanking"],
        **shape,
    )
    torch.manual_seed(seed)
    model = Qwen3Model(config).eval()
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * std
            parameter.copy_(1 + noise if name.endswith("norm.weight") else noise)
            tensors[f"model.{name}"] = parameter.detach().clone()
    hidden = config.hidden_size
    tensors["projector.0.weight"] = torch.randn(hidden // 2, hidden, generator=generator) * 0.2
    tensors["projector.2.weight"] = torch.randn(512, hidden // 2, generator=generator) * 0.2
    tensors["lm_head.weight"] = torch.randn(config.vocab_size, hidden, generator=generator)
    save_file(tensors, str(folder / "model.safetensors"))
    config.save_pretrained(folder)
    return folder


def listwise_reference(folder: Path):
    """transformers' Qwen3Model and the projector from a listwise checkpoint: (its tokenizer,
    f(prompt ids, device, dtype) -> [markers, 512] unit vectors of the marker tokens, in order)."""
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from transformers import Qwen3Model

    model = Qwen3Model.from_pretrained(folder, attn_implementation="eager").eval()
    tensors = load_file(str(folder / "model.safetensors"))
    hidden = model.config.hidden_size
    projector = torch.nn.Sequential(
        torch.nn.Linear(hidden, hidden // 2, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden // 2, 512, bias=False),
    )
    projector[0].weight.data.copy_(tensors["projector.0.weight"])
    projector[2].weight.data.copy_(tensors["projector.2.weight"])
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    markers = [tokenizer.token_to_id(token) for token in ("<|embed_token|>", "<|rerank_token|>")]

    def vectors(ids: list[int], device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
        model.to(device=device, dtype=dtype)
        projector.to(device=device, dtype=dtype)
        with torch.inference_mode():
            states = model(torch.tensor([ids], device=device)).last_hidden_state[0]
            at = torch.tensor([index for index, token in enumerate(ids) if token in markers], device=device)
            return F.normalize(projector(states[at]), dim=-1)

    return tokenizer, vectors
