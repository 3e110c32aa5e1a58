"""ModelSpec: what posy reads of a model folder (its config, sentence-transformers files, heads and
layouts) before anything is built; read_spec reads it."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.colbert import ColbertConfig, is_colbert_folder, read_colbert
from engine.cross_encoder import LogitScore, module_kinds, read_cross_encoder
from engine.errors import ModelNotFound, UnsupportedModel
from engine.models.dense import DenseLayout
from engine.models.listwise import LISTWISE_ARCHITECTURES, ListwiseConfig, read_listwise
from engine.models.registry import MODEL_TYPES, fallback_entry, lookup
from engine.models.sparse import SpladeConfig
from engine.source import POOLING_FLAGS
from engine.sparse_encoder import bare_splade, is_m3_folder, is_splade_folder, read_splade

logger = logging.getLogger(__name__)

ST_POOLING_MODES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
REMOTE_CODE = (
    "model {name!r} ships its own modeling code (auto_map in config.json): posy runs it only with "
    "--trust-remote-code, which runs the code inside the checkpoint folder"
)
# the sentence-transformers modules an embedder runs, in the order it runs them
ST_MODULE_ORDER = ("Transformer", "Pooling", "Dense", "Normalize")
ST_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    path: Path  # local folder with config.json and the weights
    name: str  # the id the user gave
    architecture: str
    hf_config: Any  # transformers.PretrainedConfig
    # the family's own config (BertConfig, DecoderConfig, ModernBertConfig), parsed from hf_config once, as
    # the spec runs it (a decoder's mask included); None for the transformers fallback
    config: Any
    # "embed" | "score" | "token_embed" (ColBERT: a vector a token) | "sparse_embed" (SPLADE: vocabulary
    # weights a text)
    task: str
    pooling: str  # "mean" | "cls" | "last"
    normalize: bool
    max_seq_length: int  # the model window, special tokens included
    vocab_size: int
    num_labels: int | None  # score models only
    output_dim: int
    tokenizer_path: Path
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    bidirectional: bool = False  # a decoder run without its causal mask
    matryoshka: bool = False  # trained so that a vector's leading dimensions are an embedding too
    pair_format: str = "pair"  # see ModelEntry.pair_format
    dense: tuple[DenseLayout, ...] = ()  # sentence-transformers Dense modules after pooling
    implementation: str = "posy"  # "posy": a packed model; "transformers": the fallback
    trust_remote_code: bool = False  # the fallback may run the code in the checkpoint folder
    logit_score: LogitScore | None = None  # a sentence-transformers CrossEncoder's judge of a causal LM
    colbert: ColbertConfig | None = None  # a ColBERT model's markers, lengths and skiplist
    splade: SpladeConfig | None = None  # a SPLADE model's pooling
    # bge-m3: its dense vector, lexical weights and ColBERT vectors from one forward (engine/models/bge_m3.py)
    m3: bool = False
    listwise: ListwiseConfig | None = None  # a listwise ranker's markers (engine/models/listwise.py)


def read_spec(
    name: str,
    folder: Path,
    bidirectional: bool = False,
    model_impl: str = "auto",
    trust_remote_code: bool = False,
    pooling_flag: str | None = None,
) -> ModelSpec:
    """`pooling_flag`: one of POOLING_FLAGS, or None for the folder's own pooling."""
    from transformers import AutoConfig

    if pooling_flag is not None and pooling_flag not in POOLING_FLAGS:
        raise UnsupportedModel(f"--pooling must be one of {', '.join(POOLING_FLAGS)}, not {pooling_flag!r}")

    modules = read_json(folder / "modules.json")
    transformer_dir = folder / sentence_transformers_path(modules, "Transformer", default="")
    if not (transformer_dir / "config.json").is_file():
        raise ModelNotFound(f"model {name!r}: no config.json in {transformer_dir}")
    remote_code = bool((read_json(transformer_dir / "config.json") or {}).get("auto_map"))
    try:
        hf_config = AutoConfig.from_pretrained(transformer_dir, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as error:
        if remote_code and not trust_remote_code:
            raise UnsupportedModel(REMOTE_CODE.format(name=name)) from error
        raise UnsupportedModel(f"model {name!r}: cannot read its config.json: {error}") from error

    architectures = getattr(hf_config, "architectures", None) or []
    given = architectures[0] if architectures else ""
    prompts_config = read_json(folder / "config_sentence_transformers.json") or {}
    # sentence-transformers' CrossEncoder folders (its modules.json holds the Transformer alone) score
    # with the checkpoint's own head; its other folders run the checkpoint as the bare model
    cross_encoder = prompts_config.get("model_type") == "CrossEncoder"
    run_bare = modules is not None and not cross_encoder
    # a LogitScore module makes any causal LM posy packs a judge
    logit_score_module = cross_encoder and "LogitScore" in module_kinds(modules or [])
    colbert = splade = None
    if is_colbert_folder(folder, modules, hf_config):
        colbert = read_colbert(name, folder, transformer_dir, modules)
    elif is_splade_folder(module_kinds(modules or [])):
        splade = read_splade(name, folder, modules or [])
    elif pooling_flag == "splade":
        splade, run_bare = bare_splade(name, given, modules), True
    listwise = None
    if given in LISTWISE_ARCHITECTURES:
        row = MODEL_TYPES.get(hf_config.model_type)
        if row is None or not row.family.decoder:
            raise UnsupportedModel(f"model {name!r}: posy runs {given} on the decoders it packs")
        listwise = read_listwise(name, transformer_dir / "tokenizer.json")
    if (
        colbert is not None and modules is None or listwise is not None
    ) and hf_config.model_type in MODEL_TYPES:
        # colbert-ai's HF_ColBERT, a listwise ranker: its bare model under posy's head
        given, run_bare = MODEL_TYPES[hf_config.model_type].bare, True
    token_head = colbert is not None or splade is not None or listwise is not None
    if token_head and model_impl == "transformers":
        raise UnsupportedModel(
            f"model {name!r}: posy runs ColBERT, SPLADE and listwise heads on the families it packs"
        )
    # bidirectional as asked (--bidirectional, `is_causal: false`): an embedder of a family that can be; or
    # as the model's own config has it (Gemma3's use_bidirectional_attention), any head
    asked = bidirectional or getattr(hf_config, "is_causal", True) is False
    entry, implementation, family_config = None, "transformers", None
    if model_impl != "transformers":
        try:
            entry = lookup(given, hf_config.model_type, run_bare, judge=logit_score_module)
            backbone = entry.family.backbone
            own = backbone.config_bidirectional(hf_config, entry.variant)
            causal = not (entry.family.decoder and (asked or own))
            # the config parsed once into the family's own; a value posy cannot honour raises here
            family_config = backbone.parse(hf_config, entry.architecture, entry.variant, causal)
            implementation = "posy"
        except UnsupportedModel as why:
            if model_impl == "posy" or token_head:
                raise
            entry = None
            logger.info("%s: posy does not pack it (%s); it runs through transformers", name, why)
    if entry is None:
        entry = fallback_entry(given, run_bare)
        if remote_code and not trust_remote_code:
            raise UnsupportedModel(REMOTE_CODE.format(name=name))
    architecture, task = entry.architecture, entry.task
    logit_score = None
    if cross_encoder:
        logit_score = read_cross_encoder(
            name, folder, transformer_dir, architecture, entry.head, modules or []
        )
        if logit_score is not None and getattr(hf_config, "final_logit_softcapping", None) is not None:
            raise UnsupportedModel(f"model {name!r}: a judge of soft-capped LM logits is not supported")
    own = entry.family.backbone.config_bidirectional(hf_config, entry.variant)
    if entry.family.decoder and asked and not own and not entry.can_be_bidirectional:
        raise UnsupportedModel(f"model {name!r}: {architecture} cannot run bidirectionally")
    bidirectional = entry.family.decoder and (asked or own)
    # a bidirectional decoder has no last token that saw the whole text: it is mean-pooled
    pooling, normalize = ("mean" if bidirectional else entry.pooling), entry.normalize
    dense: tuple[DenseLayout, ...] = ()
    if colbert is not None:
        task, normalize = "token_embed", True
        dense = colbert_projection(name, folder, modules, hf_config.hidden_size, colbert)
    elif splade is not None:
        task, normalize = "sparse_embed", False
    elif listwise is not None:
        task, normalize = "score", False
    elif modules is not None and task == "embed":
        pooling, normalize, dense = sentence_transformers_pooling(name, folder, modules)
    if pooling_flag is not None:
        splade_flag = pooling_flag == "splade"
        if task != ("sparse_embed" if splade_flag else "embed"):
            pools = "a masked LM" if splade_flag else "an embedding model"
            raise UnsupportedModel(
                f"model {name!r}: --pooling {pooling_flag} pools {pools}; this model serves {task}"
            )
        pooling = POOLING_FLAGS[pooling_flag] if splade is None else pooling
    sizes = [hf_config.hidden_size, *(layer.out_features for layer in dense)]
    for layer, size in zip(dense, sizes):
        if layer.in_features != size:
            raise UnsupportedModel(
                f"model {name!r}: a Dense module takes {layer.in_features} features, not {size}"
            )

    window = entry.family.backbone.window(hf_config, family_config)
    if implementation == "transformers":
        # posy cannot tell where an unknown family's positions start (RoBERTa's and MPNet's after the pad
        # index): its tokenizer's limit, where it names one, keeps inputs inside the position table
        limit = (read_json(transformer_dir / "tokenizer_config.json") or {}).get("model_max_length")
        if isinstance(limit, int) and 0 < limit < window:
            window = limit
    st_config = read_json(transformer_dir / "sentence_bert_config.json") or {}
    if colbert is not None:  # PyLate sets the Transformer's length to the query's or document's each call
        window = min(window, colbert.window)
    elif st_config.get("max_seq_length"):
        window = min(window, int(st_config["max_seq_length"]))
    tokenizer_path = transformer_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise UnsupportedModel(f"model {name!r}: no fast tokenizer (tokenizer.json) in {transformer_dir}")
    num_labels = hf_config.num_labels if task == "score" and listwise is None else None
    if logit_score is not None:
        num_labels = 1  # its score: the true token's logit, less the false one's
    output_dim = num_labels or sizes[-1]
    if splade is not None:
        output_dim = hf_config.vocab_size
    elif listwise is not None:
        output_dim = listwise.projection_dim
    return ModelSpec(
        path=transformer_dir,
        name=name,
        architecture=architecture,
        hf_config=hf_config,
        config=family_config,
        task=task,
        pooling=pooling,
        normalize=normalize,
        max_seq_length=window,
        vocab_size=hf_config.vocab_size,
        num_labels=num_labels,
        output_dim=output_dim,
        tokenizer_path=tokenizer_path,
        prompts=dict(prompts_config.get("prompts") or {}),
        default_prompt_name=prompts_config.get("default_prompt_name") or None,
        bidirectional=bidirectional,
        pair_format="chat-template" if logit_score is not None else entry.pair_format_of(model_card(folder)),
        logit_score=logit_score,
        implementation=implementation,
        trust_remote_code=trust_remote_code,
        dense=dense,
        matryoshka=task == "embed" and model_card_says_matryoshka(folder),
        colbert=colbert,
        splade=splade,
        # its dense vector is the [CLS] state, as its sentence-transformers Pooling says
        m3=task == "embed" and implementation == "posy" and pooling == "cls" and is_m3_folder(folder),
        listwise=listwise,
    )


def model_card(folder: Path) -> str:
    """The model card's text (README.md), empty where there is none."""
    card = folder / "README.md"
    return card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""


def model_card_says_matryoshka(folder: Path) -> bool:
    """The model card names Matryoshka training: sentence-transformers' generated cards tag
    `loss:MatryoshkaLoss`; others (Qwen3-Embedding, pplx-embed) say "Matryoshka" or "MRL"."""
    text = model_card(folder)
    return "matryoshka" in text.lower() or re.search(r"\bMRL\b", text) is not None


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def sentence_transformers_path(
    modules: list[dict] | None, kind: str, default: str | None = None
) -> str | None:
    """The folder of the first module of this kind ("Transformer", "Pooling", ...) in modules.json."""
    for module in modules or []:
        if module["type"].rsplit(".", 1)[-1] == kind:
            return module.get("path", "")
    return default


def colbert_projection(
    name: str, folder: Path, modules: list[dict] | None, hidden_size: int, colbert: ColbertConfig
) -> tuple[DenseLayout, ...]:
    """A ColBERT model's projection: PyLate's Dense modules, or colbert-ai's bias-free `linear`."""
    if modules is None:
        dim = colbert.linear_dim or hidden_size
        return (DenseLayout(folder, hidden_size, dim, bias=False, activation="Identity", residual=False),)
    kinds = module_kinds(modules)
    if [kind for kind in kinds if kind != "Dense"] != ["Transformer"] or kinds[0] != "Transformer":
        raise UnsupportedModel(f"model {name!r}: ColBERT modules {kinds} are not supported")
    return dense_layouts(name, folder, modules)


def dense_layouts(name: str, folder: Path, modules: list[dict]) -> tuple[DenseLayout, ...]:
    """The Dense modules of a sentence-transformers folder, in order."""
    dense = []
    for module in modules:
        if module["type"].rsplit(".", 1)[-1] == "Dense":
            dense_folder = folder / module.get("path", "")
            dense_config = read_json(dense_folder / "config.json")
            if dense_config is None:
                raise UnsupportedModel(
                    f"model {name!r}: no config.json in its Dense module {module.get('path')!r}"
                )
            dense.append(DenseLayout.read(dense_folder, dense_config, name))
    return tuple(dense)


def sentence_transformers_pooling(
    name: str, folder: Path, modules: list[dict]
) -> tuple[str, bool, tuple[DenseLayout, ...]]:
    """(pooling, normalize, the Dense modules after pooling) from the sentence-transformers files: the
    modules Transformer, Pooling, any Dense, then Normalize if listed, in that order."""
    kinds = [module["type"].rsplit(".", 1)[-1] for module in modules]
    unsupported = [kind for kind in kinds if kind not in ST_MODULE_ORDER]
    if unsupported:
        raise UnsupportedModel(f"model {name!r}: sentence-transformers modules {unsupported} are unsupported")
    ranks = [ST_MODULE_ORDER.index(kind) for kind in kinds]
    if ranks != sorted(ranks):
        raise UnsupportedModel(
            f"model {name!r}: sentence-transformers modules in the order {kinds} are unsupported"
        )
    pooling_path = sentence_transformers_path(modules, "Pooling")
    config = read_json(folder / pooling_path / "config.json") if pooling_path is not None else None
    if config is None:
        raise UnsupportedModel(f"model {name!r}: modules.json lists no readable Pooling config")
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [mode for key, mode in ST_LEGACY_POOLING_KEYS.items() if config.get(key)]
        mode = modes if len(modes) != 1 else modes[0]
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if not isinstance(mode, str) or mode not in ST_POOLING_MODES or config.get("include_prompt") is False:
        raise UnsupportedModel(f"model {name!r}: sentence-transformers pooling {config} is not supported")
    return ST_POOLING_MODES[mode], "Normalize" in kinds, dense_layouts(name, folder, modules)
