"""ColBERT checkpoints, in their two layouts: PyLate's (a sentence-transformers folder whose
config_sentence_transformers.json names the query and document prefixes and lengths, and a Dense
projection module) and colbert-ai's (an HF_ColBERT folder: artifact.metadata and a `linear` projection in
the checkpoint). Read into one ColbertConfig: how a text becomes a query's or a document's tokens, and
which of a document's token vectors are kept."""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.checkpoint.files import module_kinds, read_json
from engine.checkpoint.sentence_transformers import dense_layouts
from engine.errors import UnsupportedModel
from engine.models.dense import DenseLayout

COLBERT_AI_METADATA = "artifact.metadata"
# PyLate's module of the projection, and colbert-ai's architecture name in config.json
PYLATE_DENSE = "pylate.models.Dense.Dense"
COLBERT_AI_ARCHITECTURE = "HF_ColBERT"
# the defaults each layout takes where its files say nothing
PYLATE_DEFAULTS = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 32,
    "document_length": 180,
}
COLBERT_AI_DEFAULTS = {
    "query_token_id": "[unused0]",
    "doc_token_id": "[unused1]",
    "query_maxlen": 32,
    "doc_maxlen": 180,
}


# an image's vision tokens as a processor's prompt text spells them (Qwen2-VL's)
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


@dataclass(frozen=True, slots=True)
class ProcessorLayout:
    """The text a multi-vector image retriever's processor makes of its inputs (transformers'
    ColQwen2Processor and ColPaliProcessor, as colpali-engine's): a text (query or document alike)
    `query_prefix` + text + `query_suffix` (its augmentation tokens and a newline); an image document
    `image_before` + the image's vision tokens + `image_after`. Each is tokenized as it is: the processor
    writes its special tokens (ColPali's <bos>) itself."""

    query_prefix: str
    query_suffix: str
    image_before: str
    image_after: str


@dataclass(frozen=True, slots=True)
class ColbertConfig:
    query_prefix_id: int | None  # inserted after the first special token; None: no marker
    document_prefix_id: int | None
    query_length: int  # special tokens and marker included; a query is cut, then expanded to it
    document_length: int  # a document is cut to it
    expansion_token_id: int | None  # a query is padded to query_length with it; None: no expansion
    attend_to_expansion: bool  # the expansion tokens are keys too (else they only attend)
    skiplist_ids: frozenset[int]  # a document's tokens of these ids give no vector (punctuation)
    # a projection in the checkpoint (colbert-ai's `linear.weight`, ColQwen2's `embedding_proj_layer`), of
    # this many outputs (None: PyLate's Dense modules)
    linear_dim: int | None
    linear_name: str = "linear"  # the checkpoint's name of that projection
    linear_bias: bool = False
    # a wrapper's prefix of the backbone's weight names (ColQwen2's "vlm."); "": none
    wrapped_in: str = ""
    # the text its processor makes of a query, a text document and an image document (ColQwen2's); None:
    # texts as they are, with the markers above
    text_layout: ProcessorLayout | None = None

    @property
    def window(self) -> int:
        return max(self.query_length, self.document_length)

    def query_only_token(self) -> int | None:
        """The token whose trailing run in a query attends but is no key (Engine.query_only_token)."""
        return None if self.attend_to_expansion else self.expansion_token_id


def is_colbert_folder(folder: Path, modules: list[dict] | None, hf_config: Any) -> bool:
    """A PyLate folder (its Dense module is PyLate's) or a colbert-ai one."""
    if modules is not None and any(module.get("type") == PYLATE_DENSE for module in modules):
        return True
    architectures = getattr(hf_config, "architectures", None) or []
    return (folder / COLBERT_AI_METADATA).is_file() or COLBERT_AI_ARCHITECTURE in architectures


def read_colbert(name: str, folder: Path, transformer_dir: Path, modules: list[dict] | None) -> ColbertConfig:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(transformer_dir / "tokenizer.json"))
    special = special_tokens(transformer_dir)
    metadata = read_json(folder / COLBERT_AI_METADATA)
    if modules is None:  # colbert-ai's folder
        settings = {**COLBERT_AI_DEFAULTS, **(metadata or {})}
        query_prefix, document_prefix = settings["query_token_id"], settings["doc_token_id"]
        query_length, document_length = settings["query_maxlen"], settings["doc_maxlen"]
        expansion, attend = True, bool(settings.get("attend_to_mask_tokens", False))
        skiplist = list(string.punctuation) if settings.get("mask_punctuation", True) else []
    else:
        config = read_json(folder / "config_sentence_transformers.json") or {}
        settings = {**PYLATE_DEFAULTS, **{key: value for key, value in config.items() if value is not None}}
        query_prefix, document_prefix = settings["query_prefix"], settings["document_prefix"]
        query_length, document_length = settings["query_length"], settings["document_length"]
        expansion = bool(settings.get("do_query_expansion", True))
        attend = expansion and bool(settings.get("attend_to_expansion_tokens", False))
        skiplist = settings.get("skiplist_words")
        skiplist = list(string.punctuation) if skiplist is None else skiplist
    # PyLate pads a query with the mask token (an LLM's end-of-text where there is none)
    expansion_token = special.get("mask_token") or special.get("eos_token") or special.get("pad_token")
    expansion_id = _token_id(tokenizer, expansion_token) if expansion else None
    if expansion and expansion_id is None:
        raise UnsupportedModel(f"model {name!r}: a ColBERT query is expanded with a mask token; it has none")
    unknown = _token_id(tokenizer, special.get("unk_token"))
    # a word outside the vocabulary is the unknown token, as the tokenizer's convert_tokens_to_ids gives it
    skip_ids = {_token_id(tokenizer, word) for word in skiplist}
    skip_ids = {unknown if token is None else token for token in skip_ids} - {None}
    for length, label in ((query_length, "query_length"), (document_length, "document_length")):
        if not isinstance(length, int) or length < 4:
            raise UnsupportedModel(f"model {name!r}: ColBERT {label} {length!r} is not a length")
    return ColbertConfig(
        query_prefix_id=_prefix_id(name, tokenizer, query_prefix),
        document_prefix_id=_prefix_id(name, tokenizer, document_prefix),
        query_length=query_length,
        document_length=document_length,
        expansion_token_id=expansion_id,
        attend_to_expansion=attend,
        skiplist_ids=frozenset(skip_ids),  # type: ignore[arg-type]
        linear_dim=int(settings.get("dim", 128)) if modules is None else None,
    )


def special_tokens(transformer_dir: Path) -> dict[str, str]:
    """The tokenizer's named special tokens (mask_token, unk_token, ...) as strings."""
    found: dict[str, str] = {}
    for file in ("special_tokens_map.json", "tokenizer_config.json"):
        for key, token in (read_json(transformer_dir / file) or {}).items():
            token = token.get("content") if isinstance(token, dict) else token
            if key.endswith("_token") and isinstance(token, str):
                found.setdefault(key, token)
    return found


def _token_id(tokenizer, token: str | None) -> int | None:
    return None if token is None else tokenizer.token_to_id(token)


def _prefix_id(name: str, tokenizer, prefix: str | None) -> int | None:
    if not prefix:
        return None
    token = tokenizer.token_to_id(prefix)
    if token is None:
        raise UnsupportedModel(f"model {name!r}: its ColBERT marker {prefix!r} is no token of its tokenizer")
    return token


@dataclass(frozen=True, slots=True)
class MultiVectorVision:
    """A multi-vector image retriever over a vision-language model (transformers' ColQwen2ForRetrieval,
    ColPaliForRetrieval: the model under "vlm.", an `embedding_proj_layer` with a bias): the model type it
    wraps, and the text its processor makes of a query and of an image document. `query` and `image` are
    str.format templates of the processor's settings (`settings`, its defaults where processor_config.json
    names none), the tokenizer's special tokens (`tokens`: bos, pad, their defaults where it names none),
    `augmentation` (ten pads), a query's `text` and an image's `image` (IMAGE_PLACEHOLDER)."""

    model_type: str
    settings: dict[str, str]
    tokens: dict[str, str]
    query: str
    image: str


MULTI_VECTOR_VISION = {
    "ColQwen2ForRetrieval": MultiVectorVision(
        model_type="qwen2_vl",
        settings={
            "query_prefix": "Query: ",
            "visual_prompt_prefix": (
                f"<|im_start|>user\n{IMAGE_PLACEHOLDER}Describe the image.<|im_end|><|endoftext|>"
            ),
        },
        tokens={"pad": "<|endoftext|>"},
        query="{query_prefix}{text}{augmentation}\n",
        image="{visual_prompt_prefix}",
    ),
    # PaliGemma's image first, then the beginning of its text
    "ColPaliForRetrieval": MultiVectorVision(
        model_type="paligemma",
        settings={"query_prefix": "Question: ", "visual_prompt_prefix": "Describe the image."},
        tokens={"pad": "<pad>", "bos": "<bos>"},
        query="{bos}{query_prefix}{text}{augmentation}\n",
        image="{image}{bos}{visual_prompt_prefix}\n",
    ),
}
PROJECTION, WRAPPER = "embedding_proj_layer", "vlm."
QUERY_AUGMENTATION = 10  # the processor's pad tokens after a query's text
TEXT_MARK = "\x00"  # where a query's text goes in its template


def read_multi_vector_vision(
    name: str, folder: Path, checkpoint_config: dict, architecture: str, hf_config: Any
) -> ColbertConfig:
    """A ColQwen2's or a ColPali's layout: every token of a query and of a document gives a vector (no
    markers, no expansion, no skiplist), through a projection with a bias to `embedding_dim`, each as long
    as the model's window; its texts as its processor config lays them out (`text_layout`)."""
    retriever = MULTI_VECTOR_VISION[architecture]
    settings = {**retriever.settings, **(read_json(folder / "processor_config.json") or {})}
    special = special_tokens(folder)
    tokens = {key: special.get(f"{key}_token", default) for key, default in retriever.tokens.items()}
    fields = {**settings, **tokens, "augmentation": tokens["pad"] * QUERY_AUGMENTATION}
    image_prompt = retriever.image.format(**fields, image=IMAGE_PLACEHOLDER)
    if image_prompt.count(IMAGE_PLACEHOLDER) != 1:
        raise UnsupportedModel(f"model {name!r}: its visual prompt does not hold {IMAGE_PLACEHOLDER} once")
    before, after = image_prompt.split(IMAGE_PLACEHOLDER)
    query_prefix, query_suffix = retriever.query.format(**fields, text=TEXT_MARK).split(TEXT_MARK)
    window = hf_config.get_text_config().max_position_embeddings
    return ColbertConfig(
        query_prefix_id=None,
        document_prefix_id=None,
        query_length=window,
        document_length=window,
        expansion_token_id=None,
        attend_to_expansion=True,
        skiplist_ids=frozenset(),
        linear_dim=int(checkpoint_config.get("embedding_dim", 128)),
        linear_name=PROJECTION,
        linear_bias=True,
        wrapped_in=WRAPPER,
        text_layout=ProcessorLayout(query_prefix, query_suffix, before, after),
    )


def colbert_projection(
    name: str, folder: Path, modules: list[dict] | None, hidden_size: int, colbert: ColbertConfig
) -> tuple[DenseLayout, ...]:
    """A ColBERT model's projection: PyLate's Dense modules, or one in the checkpoint (colbert-ai's bias-free
    `linear`, ColQwen2's `embedding_proj_layer`)."""
    if modules is None:
        dim, bias = colbert.linear_dim or hidden_size, colbert.linear_bias
        return (DenseLayout(folder, hidden_size, dim, bias=bias, activation="Identity", residual=False),)
    kinds = module_kinds(modules)
    if [kind for kind in kinds if kind != "Dense"] != ["Transformer"] or kinds[0] != "Transformer":
        raise UnsupportedModel(f"model {name!r}: ColBERT modules {kinds} are not supported")
    return dense_layouts(name, folder, modules)
