"""ModelSpec: what posy reads of a model folder (its config, its head, its window) before anything is
built; read_spec reads it in a few steps."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.checkpoint.colbert import ColbertConfig
from engine.checkpoint.contextual import ChunkJoin, read_chunk_join
from engine.checkpoint.cross_encoder import ChatTemplate, LogitScore, read_chat_template
from engine.checkpoint.files import model_card, model_card_says_matryoshka, read_json
from engine.checkpoint.folder import REMOTE_CODE, Checkpoint, read_folder
from engine.checkpoint.images import (
    ImageLayout,
    read_dynamic_image_layout,
    read_image_layout,
    read_naflex_image_layout,
)
from engine.checkpoint.listwise import ListwiseConfig
from engine.checkpoint.sentence_transformers import native_quantization
from engine.checkpoint.splade import SpladeConfig
from engine.errors import UnsupportedModel
from engine.models.bge_m3 import M3Spec
from engine.models.clip import DualEncoderConfig
from engine.models.dense import DenseLayout
from engine.models.head_spec import HeadSpec
from engine.models.heads import JudgeSpec
from engine.models.late_interaction import ColbertSpec
from engine.models.listwise import ListwiseSpec
from engine.models.paligemma import PaliGemmaConfig
from engine.models.registry import (
    MODEL_TYPES,
    ModelEntry,
    architecture_head,
    detect_head,
    fallback_entry,
    lookup,
)
from engine.models.sparse import SpladeSpec
from engine.models.vision_language import VisionLanguageConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InputLayout:
    """A vision-language embedder's layout of each input: a user turn of it in its chat template, after a
    system turn of `system` (None: the template's own default), then the assistant's prompt."""

    template: ChatTemplate
    system: str | None = None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    path: Path  # local folder with config.json and the weights
    name: str  # the id the user gave
    architecture: str
    hf_config: Any  # transformers.PretrainedConfig
    # the family's own config (BertConfig, DecoderConfig, ModernBertConfig), parsed from hf_config once, as
    # the spec runs it (a decoder's mask included); None for the transformers fallback
    config: Any
    head: HeadSpec  # the head it is served with (engine/models/head_spec.py)
    max_seq_length: int  # the model window, special tokens included
    vocab_size: int
    tokenizer_path: Path
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    bidirectional: bool = False  # a decoder run without its causal mask
    matryoshka: bool = False  # trained so that a vector's leading dimensions are an embedding too
    pair_format: str = "pair"  # see ModelEntry.pair_format
    implementation: str = "posy"  # "posy": a packed model; "transformers": the fallback
    trust_remote_code: bool = False  # the fallback may run the code in the checkpoint folder
    images: ImageLayout | None = None  # how it takes an image; None: it takes none
    # (length, pad id): every text is padded to that many tokens, as the model was trained (SigLIP)
    text_padding: tuple[int, int] | None = None
    # how a vision-language embedder lays out each input (text or image); None: its tokenizer's template
    input_layout: InputLayout | None = None
    # the quantization its own quantizer module makes of its raw vectors (sentence_transformers.py
    # QUANTIZER_MODULES: "tanh", pplx-embed's); None: it has none
    native_quantization: str | None = None
    # how a contextual embedder joins a document's chunks in one pass (pplx-embed-context); None: not one
    chunk_join: ChunkJoin | None = None
    # the width of a row its head gives (the head's, read once: a route asks it of every request, and a
    # transformers config's get_text_config() costs 25 to 40 us)
    output_dim: int = 0

    # what the head says of the served model
    @property
    def longest_sequence(self) -> int:
        """The longest sequence a batch may hold: the window, or a dual encoder's image where that is longer
        (CLIP ViT-B/16's 197 tokens against its texts' 77; a NaFlex image's most)."""
        images = self.images
        if images is None or (images.image_size is None and images.max_num_patches is None):
            return self.max_seq_length
        return max(self.max_seq_length, images.num_tokens)

    @property
    def task(self) -> str:
        """ "embed" | "score" | "token_embed" (a vector a token) | "sparse_embed" (vocabulary weights)."""
        return self.head.task

    @property
    def pooling(self) -> str:
        return self.head.pooling

    @property
    def normalize(self) -> bool:
        return self.head.normalize

    @property
    def num_labels(self) -> int | None:
        return self.head.num_labels

    @property
    def dense(self) -> tuple[DenseLayout, ...]:
        return self.head.dense


    # the layouts of the heads that have one, for the routes that read them
    @property
    def colbert(self) -> ColbertConfig | None:
        return self.head.colbert if isinstance(self.head, ColbertSpec) else None

    @property
    def splade(self) -> SpladeConfig | None:
        return self.head.splade if isinstance(self.head, SpladeSpec) else None

    @property
    def listwise(self) -> ListwiseConfig | None:
        return self.head.listwise if isinstance(self.head, ListwiseSpec) else None

    @property
    def logit_score(self) -> LogitScore | None:
        return self.head.logit_score if isinstance(self.head, JudgeSpec) else None

    @property
    def m3(self) -> bool:
        """bge-m3: its dense vector, lexical weights and ColBERT vectors from one forward."""
        return isinstance(self.head, M3Spec)


def read_spec(
    name: str,
    folder: Path,
    bidirectional: bool = False,
    model_impl: str = "auto",
    trust_remote_code: bool = False,
    pooling_flag: str | None = None,
) -> ModelSpec:
    """`pooling_flag`: one of POOLING_FLAGS, or None for the folder's own pooling."""
    checkpoint = read_folder(name, folder, trust_remote_code, pooling_flag)
    detected = detect_head(checkpoint)  # a head that replaces the checkpoint's own (ColBERT, SPLADE, ...)
    if detected is not None and model_impl == "transformers":
        raise UnsupportedModel(
            f"model {name!r}: posy runs ColBERT, SPLADE and listwise heads on the families it packs"
        )
    # bidirectional as asked (--bidirectional, `is_causal: false`): an embedder of a family that can be; or
    # as the model's own config has it (Gemma3's use_bidirectional_attention), any head
    asked = bidirectional or getattr(checkpoint.hf_config, "is_causal", True) is False
    entry, family_config = None, None
    if model_impl != "transformers":
        try:
            entry, family_config = packed_entry(checkpoint, detected is not None, asked)
        except UnsupportedModel as why:
            if model_impl == "posy" or detected is not None:
                raise
            logger.info("%s: posy does not pack it (%s); it runs through transformers", name, why)
    implementation = "posy" if entry is not None else "transformers"
    if entry is None:
        entry = fallback_entry(checkpoint.architecture, checkpoint.runs_bare)
        if checkpoint.remote_code and not trust_remote_code:
            raise UnsupportedModel(REMOTE_CODE.format(name=name))
    bidirectional = runs_bidirectionally(checkpoint, entry, asked)
    head = detected or architecture_head(checkpoint, entry, implementation == "posy", bidirectional)
    check_head(checkpoint, head)
    window = served_window(checkpoint, entry, family_config, implementation, head)
    tokenizer_path = checkpoint.transformer_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise UnsupportedModel(
            f"model {name!r}: no fast tokenizer (tokenizer.json) in {checkpoint.transformer_dir}"
        )
    st_config = checkpoint.st_config
    embeds = head.task == "embed"
    return ModelSpec(
        path=checkpoint.transformer_dir,
        name=name,
        architecture=entry.architecture,
        hf_config=checkpoint.hf_config,
        config=family_config,
        head=head,
        max_seq_length=window,
        vocab_size=checkpoint.hf_config.get_text_config().vocab_size,
        tokenizer_path=tokenizer_path,
        prompts=dict(st_config.get("prompts") or {}),
        default_prompt_name=st_config.get("default_prompt_name") or None,
        bidirectional=bidirectional,
        pair_format=pair_format(checkpoint, entry, head),
        implementation=implementation,
        trust_remote_code=trust_remote_code,
        matryoshka=embeds and model_card_says_matryoshka(folder),
        images=image_layout(checkpoint, family_config),
        text_padding=text_padding(checkpoint, family_config),
        input_layout=input_layout(checkpoint, family_config) if embeds else None,
        native_quantization=native_quantization(checkpoint.modules) if embeds else None,
        output_dim=head.output_dim(checkpoint.hf_config),
        chunk_join=read_chunk_join(checkpoint, tokenizer_path) if embeds else None,
    )


def input_layout(checkpoint: Checkpoint, family_config: Any) -> InputLayout | None:
    """How a vision-language embedder lays each input out (its chat template); a ranker's or a multi-vector
    model's pairs and inputs are laid out by scoring."""
    if not isinstance(family_config, VisionLanguageConfig):
        return None
    purpose = "it lays out its inputs with its chat template"
    template = read_chat_template(checkpoint.name, checkpoint.transformer_dir, purpose)
    return InputLayout(template, family_config.family.instruction)


def text_padding(checkpoint: Checkpoint, family_config: Any) -> tuple[int, int] | None:
    if not (isinstance(family_config, DualEncoderConfig) and family_config.variant.pads_texts):
        return None
    text = checkpoint.hf_config.text_config
    return text.max_position_embeddings, text.pad_token_id


def image_layout(checkpoint: Checkpoint, family_config: Any) -> ImageLayout | None:
    """How a model with a vision tower (a dual encoder, a vision-language model) takes an image; None for
    a text model."""
    if isinstance(family_config, VisionLanguageConfig):
        vision = checkpoint.hf_config.vision_config
        return read_dynamic_image_layout(checkpoint.name, checkpoint.transformer_dir, vision)
    if isinstance(family_config, PaliGemmaConfig):  # a fixed square, a token a patch
        vision = checkpoint.hf_config.vision_config
        return read_image_layout(checkpoint.name, checkpoint.transformer_dir, vision, 0)
    if not isinstance(family_config, DualEncoderConfig):
        return None
    if family_config.variant.naflex:
        return read_naflex_image_layout(
            checkpoint.name, checkpoint.transformer_dir, checkpoint.hf_config.vision_config
        )
    leading = int(family_config.variant.class_token)
    return read_image_layout(
        checkpoint.name, checkpoint.transformer_dir, checkpoint.hf_config.vision_config, leading
    )


def packed_entry(
    checkpoint: Checkpoint, replaced_head: bool, asked_bidirectional: bool
) -> tuple[ModelEntry, Any]:
    """The packed family that serves the checkpoint (its bare model, where a detected head replaces its
    own), and its config parsed into the family's own; UnsupportedModel where posy packs none."""
    hf_config, architecture, bare = checkpoint.hf_config, checkpoint.architecture, checkpoint.runs_bare
    if replaced_head:
        row = MODEL_TYPES.get(hf_config.model_type)
        architecture, bare = (row.bare if row is not None else architecture), True
    entry = lookup(architecture, hf_config.model_type, bare, judge=checkpoint.judge_module)
    backbone = entry.family.backbone
    own = backbone.config_bidirectional(hf_config, entry.variant)
    causal = not (entry.family.decoder and (asked_bidirectional or own))
    # a value posy cannot honour raises here
    return entry, backbone.parse(hf_config, entry.architecture, entry.variant, causal)


def runs_bidirectionally(checkpoint: Checkpoint, entry: ModelEntry, asked: bool) -> bool:
    """A decoder runs without its causal mask where asked (of an embedder that can) or where its own config
    says so; an encoder is bidirectional anyway and says False."""
    if not entry.family.decoder:
        return False
    own = entry.family.backbone.config_bidirectional(checkpoint.hf_config, entry.variant)
    if asked and not own and not entry.can_be_bidirectional:
        raise UnsupportedModel(f"model {checkpoint.name!r}: {entry.architecture} cannot run bidirectionally")
    return asked or own


def check_head(checkpoint: Checkpoint, head: HeadSpec) -> None:
    """--pooling pools what it can (an embedder, or a masked LM as SPLADE), and each Dense module takes
    what the one before it gives."""
    name, flag = checkpoint.name, checkpoint.pooling_flag
    if flag is not None:
        splade_flag = flag == "splade"
        if head.task != ("sparse_embed" if splade_flag else "embed"):
            pools = "a masked LM" if splade_flag else "an embedding model"
            raise UnsupportedModel(
                f"model {name!r}: --pooling {flag} pools {pools}; this model serves {head.task}"
            )
    if not head.dense:
        return
    sizes = [
        checkpoint.hf_config.get_text_config().hidden_size,
        *(layer.out_features for layer in head.dense),
    ]
    for layer, size in zip(head.dense, sizes):
        if layer.in_features != size:
            raise UnsupportedModel(
                f"model {name!r}: a Dense module takes {layer.in_features} features, not {size}"
            )


def served_window(
    checkpoint: Checkpoint, entry: ModelEntry, family_config: Any, implementation: str, head: HeadSpec
) -> int:
    window = entry.family.backbone.window(checkpoint.hf_config, family_config)
    transformer_dir = checkpoint.transformer_dir
    if implementation == "transformers":
        # posy cannot tell where an unknown family's positions start (RoBERTa's and MPNet's after the pad
        # index): its tokenizer's limit, where it names one, keeps inputs inside the position table
        limit = (read_json(transformer_dir / "tokenizer_config.json") or {}).get("model_max_length")
        if isinstance(limit, int) and 0 < limit < window:
            window = limit
    st_length = (read_json(transformer_dir / "sentence_bert_config.json") or {}).get("max_seq_length")
    return head.window(window, int(st_length) if st_length else None)


def pair_format(checkpoint: Checkpoint, entry: ModelEntry, head: HeadSpec) -> str:
    """How rerank lays out a (query, document) pair: a LogitScore judge by its chat template, else as the
    head's own (a ranker's layout its detector knows), or as the family (and its model card, for a judge's
    classifier conversion) says."""
    if isinstance(head, JudgeSpec) and head.logit_score is not None:
        return "chat-template"
    if head.pair_format is not None:
        return head.pair_format
    return entry.pair_format_of(model_card(checkpoint.folder))
