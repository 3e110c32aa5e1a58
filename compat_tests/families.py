"""Tiny random-weight checkpoints laid out as each family's hub models are (config, trained fast tokenizer,
sentence-transformers files, model card), and the transformers reference on the same weights, fp32 CPU."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from torch import nn

HIDDEN = 64
# 1_Pooling/config.json as the hub repositories carry it: one flag per pooling mode
POOLING_FLAGS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}
CPU_FLOAT32 = ("--device", "cpu", "--dtype", "float32")  # the reference runs in fp32 on the CPU
MAX_POSITIONS = 512
DENSE_OUT = 48  # the LaBSE-style family's vectors, after its Dense modules
MODERNBERT_LOCAL_ATTENTION = 8  # a sliding layer sees 4 tokens on each side: every test text is longer
GEMMA3_SLIDING_WINDOW = 8  # causal: 7 keys back; bidirectional: 4 on each side
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

# Qwen3-Reranker's prompt as its model card writes it, kept apart from posy's copy in scoring/templates.py
JUDGE_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
JUDGE_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
JUDGE_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# Qwen3-Embedding's config_sentence_transformers.json
QWEN3_EMBEDDING_PROMPTS = {"query": f"Instruct: {JUDGE_INSTRUCTION}\nQuery:", "document": ""}

# what the tokenizers are trained on: most texts the tests send, the prompts, and "yes" / "no" on lines of
# their own, so that those are single tokens and the prompts tokenize into merged pieces, not bytes
CORPUS = [
    "What is the capital of France?",
    "Paris is the capital and largest city of France.",
    "Bananas are a yellow fruit rich in potassium.",
    "The Eiffel Tower was finished in 1889.",
    "Python is a popular programming language.",
    "Where do emperor penguins raise their chicks?",
    "Emperor penguins raise their chicks on the Antarctic sea ice through the long dark winter.",
    "The train to Berlin leaves from platform nine.",
    "Stock prices rose sharply after the earnings report.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Which battery lasts longest in cold weather?",
    "The reviewer says the phone battery lasts two days, even in the cold.",
    "Given a product question, find the customer review that answers it",
    JUDGE_PREFIX,
    JUDGE_SUFFIX,
    f"<Instruct>: {JUDGE_INSTRUCTION}\n<Query>: question\n<Document>: passage",
    QWEN3_EMBEDDING_PROMPTS["query"],
    "yes",
    "no",
]


def training_corpus() -> list[str]:
    return CORPUS * 20


def xlm_roberta_tokenizer() -> Tokenizer:
    """A SentencePiece-style Unigram with XLM-R's specials <s>=0, <pad>=1, </s>=2, <unk>=3 and its
    templates `<s> $A </s>` and `<s> $A </s> </s> $B </s>` (all token type 0)."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    trainer = trainers.UnigramTrainer(
        vocab_size=400, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    tokenizer.train_from_iterator(training_corpus(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    assert [tokenizer.token_to_id(token) for token in specials] == [0, 1, 2, 3]
    return tokenizer


def byte_level_bpe(specials: list[str], vocab_size: int = 600) -> Tokenizer:
    """Qwen2's tokenizer pipeline (its split pattern, then bytes) trained on the corpus."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_corpus(), trainer)
    return tokenizer


def qwen3_tokenizer(append_endoftext: bool) -> Tokenizer:
    """Qwen3-Embedding's tokenizer appends <|endoftext|> to every text; Qwen3-Reranker's adds nothing."""
    tokenizer = byte_level_bpe(QWEN_SPECIALS)
    if append_endoftext:
        eos = tokenizer.token_to_id("<|endoftext|>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A:0 <|endoftext|>:0",
            pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1",
            special_tokens=[("<|endoftext|>", eos)],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    assert tokenizer.token_to_id("yes") is not None and tokenizer.token_to_id("no") is not None
    return tokenizer


def modernbert_tokenizer() -> Tokenizer:
    """ModernBERT's layout: byte-level BPE with [CLS] $A [SEP] and [CLS] $A [SEP] $B [SEP]."""
    tokenizer = byte_level_bpe(["[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 0), ("[SEP]", 2)]
    )
    return tokenizer


# checkpoints


def model_class(folder: Path) -> type[nn.Module]:
    """The transformers class of a saved checkpoint's first architecture."""
    import transformers

    return getattr(transformers, json.loads((folder / "config.json").read_text())["architectures"][0])


def randomize(model: nn.Module, std: float) -> nn.Module:
    """Weights larger than the default init so every one matters; norm scales around one, as trained."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, std)
    return model.eval()


def save(folder: Path, model: nn.Module, tokenizer: Tokenizer) -> nn.Module:
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    return model


def write_sentence_transformers(
    folder: Path, pooling_mode: str, normalize: bool, prompts: dict[str, str] | None = None
) -> None:
    """modules.json, 1_Pooling/config.json and (with prompts) config_sentence_transformers.json."""
    kinds = ["Transformer", "Pooling", *(["Normalize"] if normalize else [])]
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize"}
    modules = [
        {
            "idx": index,
            "name": str(index),
            "path": paths[kind],
            "type": f"sentence_transformers.models.{kind}",
        }
        for index, kind in enumerate(kinds)
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    flags = {flag: mode == pooling_mode for mode, flag in POOLING_FLAGS.items()}
    pooling = {"word_embedding_dimension": HIDDEN, **flags, "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if normalize:
        (folder / "2_Normalize").mkdir()
    if prompts is not None:
        config = {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"}
        (folder / "config_sentence_transformers.json").write_text(json.dumps(config))


def xlm_roberta_config(architecture: str):
    import transformers

    return transformers.XLMRobertaConfig(
        vocab_size=xlm_roberta_tokenizer().get_vocab_size(),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=MAX_POSITIONS + 2,  # RoBERTa positions start after the pad id 1
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        num_labels=1,
        architectures=[architecture],
    )


def build_bge_m3(folder: Path) -> nn.Module:
    import transformers

    model = randomize(transformers.XLMRobertaModel(xlm_roberta_config("XLMRobertaModel")), 0.2)
    write_sentence_transformers(folder, "cls", normalize=True)
    return save(folder, model, xlm_roberta_tokenizer())


def build_bge_reranker(folder: Path) -> nn.Module:
    import transformers

    config = xlm_roberta_config("XLMRobertaForSequenceClassification")
    model = randomize(transformers.XLMRobertaForSequenceClassification(config), 0.2)
    return save(folder, model, xlm_roberta_tokenizer())


class PositionsFromZero(nn.Module):
    """A RoBERTa given positions 0, 1, ... as BERT counts them, not from pad_token_id + 1."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        positions = torch.arange(input_ids.shape[1])[None]
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions)


def xlm_roberta_positions_from_zero(folder: Path) -> nn.Module:
    return PositionsFromZero(model_class(folder).from_pretrained(folder).eval())


def qwen3_config(architecture: str, tokenizer: Tokenizer, **overrides):
    import transformers

    settings = dict(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        head_dim=24,  # not hidden_size / heads, as in the real sizes
        intermediate_size=96,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,  # as the 0.6B checkpoints
        bos_token_id=None,
        eos_token_id=tokenizer.token_to_id("<|endoftext|>"),
        pad_token_id=tokenizer.token_to_id("<|endoftext|>"),
        architectures=[architecture],
    )
    settings.update(overrides)
    return transformers.Qwen3Config(**settings)


def build_qwen3_embedding(folder: Path) -> nn.Module:
    """Qwen3-Embedding: a Qwen3ForCausalLM checkpoint with last-token sentence-transformers files, query
    and document prompts, and a model card that names MRL."""
    import transformers

    tokenizer = qwen3_tokenizer(append_endoftext=True)
    model = randomize(transformers.Qwen3ForCausalLM(qwen3_config("Qwen3ForCausalLM", tokenizer)), 0.1)
    write_sentence_transformers(folder, "lasttoken", normalize=True, prompts=QWEN3_EMBEDDING_PROMPTS)
    (folder / "README.md").write_text(
        "---\nlibrary_name: sentence-transformers\n---\n# Tiny Qwen3 embedding\n\n"
        "- Supports user-defined output dimensions (MRL support) from 32 to 1024.\n"
    )
    return save(folder, model, tokenizer).model


def build_pplx_embed(folder: Path) -> nn.Module:
    """pplx-embed: a Qwen3Model whose config says is_causal false, mean-pooled and not normalized."""
    import transformers

    tokenizer = qwen3_tokenizer(append_endoftext=False)
    config = qwen3_config("Qwen3Model", tokenizer, is_causal=False)
    model = randomize(transformers.Qwen3Model(config), 0.1)
    write_sentence_transformers(folder, "mean", normalize=False)
    save(folder, model, tokenizer)
    # transformers honours `is_causal: false` from the config when it builds the mask itself (eager)
    return transformers.Qwen3Model.from_pretrained(folder, attn_implementation="eager").eval()


def causal_pplx_embed(folder: Path) -> nn.Module:
    import transformers

    return transformers.Qwen3Model.from_pretrained(folder, attn_implementation="eager", is_causal=True).eval()


def build_qwen3_reranker(folder: Path) -> nn.Module:
    """Qwen3-Reranker: a bare Qwen3ForCausalLM, no sentence-transformers files."""
    import transformers

    tokenizer = qwen3_tokenizer(append_endoftext=False)
    model = randomize(transformers.Qwen3ForCausalLM(qwen3_config("Qwen3ForCausalLM", tokenizer)), 0.1)
    return save(folder, model, tokenizer)


def modernbert_config(architecture: str, **overrides):
    import transformers

    return transformers.ModernBertConfig(
        vocab_size=modernbert_tokenizer().get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        global_attn_every_n_layers=2,  # full, sliding, full
        local_attention=MODERNBERT_LOCAL_ATTENTION,
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=1,
        bos_token_id=0,
        cls_token_id=0,
        eos_token_id=2,
        sep_token_id=2,
        num_labels=1,
        architectures=[architecture],
        **overrides,
    )


def build_gte_modernbert(folder: Path) -> nn.Module:
    import transformers

    model = randomize(transformers.ModernBertModel(modernbert_config("ModernBertModel")), 0.2)
    write_sentence_transformers(folder, "cls", normalize=True)
    return save(folder, model, modernbert_tokenizer())


def modernbert_without_sliding_window(folder: Path) -> nn.Module:
    return model_class(folder).from_pretrained(folder, local_attention=4 * MAX_POSITIONS).eval()


def build_gte_reranker_modernbert(folder: Path) -> nn.Module:
    import transformers

    config = modernbert_config("ModernBertForSequenceClassification", classifier_pooling="mean")
    model = randomize(transformers.ModernBertForSequenceClassification(config), 0.2)
    return save(folder, model, modernbert_tokenizer())


def distilbert_config(architecture: str):
    import transformers

    return transformers.DistilBertConfig(
        vocab_size=modernbert_tokenizer().get_vocab_size(), dim=HIDDEN, n_layers=2, n_heads=4, hidden_dim=128,
        max_position_embeddings=MAX_POSITIONS, pad_token_id=1, num_labels=1, architectures=[architecture],
    )  # fmt: skip


def build_msmarco_distilbert(folder: Path) -> nn.Module:
    """msmarco-distilbert-base: DistilBertModel, mean-pooled, normalized (its sentence-transformers files)."""
    import transformers

    model = randomize(transformers.DistilBertModel(distilbert_config("DistilBertModel")), 0.2)
    write_sentence_transformers(folder, "mean", normalize=True)
    return save(folder, model, modernbert_tokenizer())


def build_distilbert_cross_encoder(folder: Path) -> nn.Module:
    import transformers

    config = distilbert_config("DistilBertForSequenceClassification")
    model = randomize(transformers.DistilBertForSequenceClassification(config), 0.2)
    return save(folder, model, modernbert_tokenizer())


def build_camembert(folder: Path) -> nn.Module:
    """sentence-camembert: CamembertModel (RoBERTa's positions after the pad id), mean-pooled."""
    import transformers

    config = transformers.CamembertConfig(
        vocab_size=xlm_roberta_tokenizer().get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=MAX_POSITIONS + 2,
        type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2, architectures=["CamembertModel"],
    )  # fmt: skip
    model = randomize(transformers.CamembertModel(config), 0.2)
    write_sentence_transformers(folder, "mean", normalize=True)
    return save(folder, model, xlm_roberta_tokenizer())


def roberta_positions_from_zero(folder: Path) -> nn.Module:
    return PositionsFromZero(model_class(folder).from_pretrained(folder).eval())


def build_distilroberta(folder: Path) -> nn.Module:
    """all-distilroberta-v1: RobertaModel (positions after the pad id, one token type), mean-pooled and
    normalized; its specials are RoBERTa's <s>=0, <pad>=1, </s>=2, <unk>=3, as this tokenizer's are."""
    import transformers

    config = transformers.RobertaConfig(
        vocab_size=xlm_roberta_tokenizer().get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=MAX_POSITIONS + 2,
        type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2, architectures=["RobertaModel"],
    )  # fmt: skip
    model = randomize(transformers.RobertaModel(config), 0.2)
    write_sentence_transformers(folder, "mean", normalize=True)
    return save(folder, model, xlm_roberta_tokenizer())


def decoder_config(config_name: str, architecture: str, tokenizer: Tokenizer, **overrides):
    import transformers

    settings = dict(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, intermediate_size=96, max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6, pad_token_id=tokenizer.token_to_id("<|endoftext|>"), num_labels=1,
        architectures=[architecture],
    )  # fmt: skip
    return getattr(transformers, config_name)(**{**settings, **overrides})


def build_gte_qwen2(folder: Path) -> nn.Module:
    """gte-Qwen2-instruct: a Qwen2ForCausalLM checkpoint (q, k, v biases) with last-token files."""
    import transformers

    tokenizer = qwen3_tokenizer(append_endoftext=True)
    config = decoder_config("Qwen2Config", "Qwen2ForCausalLM", tokenizer, tie_word_embeddings=False)
    model = randomize(transformers.Qwen2ForCausalLM(config), 0.1)
    write_sentence_transformers(folder, "lasttoken", normalize=True)
    return save(folder, model, tokenizer).model


def build_e5_mistral(folder: Path) -> nn.Module:
    """e5-mistral-7b-instruct: a MistralModel with a sliding window, last-token files."""
    import transformers

    tokenizer = qwen3_tokenizer(append_endoftext=True)
    config = decoder_config("MistralConfig", "MistralModel", tokenizer, sliding_window=MAX_POSITIONS)
    model = randomize(transformers.MistralModel(config), 0.1)
    write_sentence_transformers(folder, "lasttoken", normalize=True)
    return save(folder, model, tokenizer)


def build_llama_embedder(folder: Path) -> nn.Module:
    """A Llama embedder (LLM2Vec / Llama-based sentence-transformers models): LlamaModel with attention
    and MLP biases, causal, last-token files."""
    import transformers

    tokenizer = qwen3_tokenizer(append_endoftext=True)
    config = decoder_config("LlamaConfig", "LlamaModel", tokenizer, attention_bias=True, mlp_bias=True)
    model = randomize(transformers.LlamaModel(config), 0.1)
    write_sentence_transformers(folder, "lasttoken", normalize=True)
    return save(folder, model, tokenizer)


def build_decoder_cross_encoder(folder: Path, config_name: str, architecture: str, **overrides) -> nn.Module:
    """A decoder cross-encoder (*ForSequenceClassification): the last token through `score`."""
    import transformers

    tokenizer = qwen3_tokenizer(append_endoftext=True)
    config = decoder_config(config_name, architecture, tokenizer, **overrides)
    return save(folder, randomize(getattr(transformers, architecture)(config), 0.1), tokenizer)


# a causal reranker's chat template that lays out a sentence-transformers pair (a "query" and a
# "document" message); the query's first word follows ": " and the document's first word follows ":"
LOGIT_SCORE_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document answers the Query. Answer yes or no.<|im_end|>\n"
    "{% for message in messages %}{% if message['role'] == 'query' %}"
    "<|im_start|>user\n<Query>: {{ message['content'] }}\n"
    "{% elif message['role'] == 'document' %}<Document>:{{ message['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_logit_score_reranker(folder: Path):
    """A sentence-transformers 6 CrossEncoder of a causal LM, as CrossEncoder.save writes it: a
    Qwen2ForCausalLM, a LogitScore module ("yes" less "no" at the last token), the chat template above
    with add_generation_prompt; returns sentence-transformers' CrossEncoder loaded from the folder."""
    import transformers
    from sentence_transformers import CrossEncoder

    tokenizer = qwen3_tokenizer(append_endoftext=False)
    config = decoder_config("Qwen2Config", "Qwen2ForCausalLM", tokenizer, tie_word_embeddings=False)
    source = folder.parent / f"{folder.name}-source"
    source.mkdir()
    save(source, randomize(transformers.Qwen2ForCausalLM(config), 0.1), tokenizer)
    tokenizer_config = {
        "chat_template": LOGIT_SCORE_TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"
    }  # fmt: skip
    (source / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    CrossEncoder(str(source), device="cpu").save(str(folder))
    settings = json.loads((folder / "sentence_bert_config.json").read_text())
    settings["processing_kwargs"] = {"chat_template": {"add_generation_prompt": True}}
    (folder / "sentence_bert_config.json").write_text(json.dumps(settings))
    return CrossEncoder(str(folder), device="cpu")


def build_electra_embedder(folder: Path) -> nn.Module:
    """An ELECTRA embedder (posy packs no ELECTRA: it runs through transformers, sdpa), mean-pooled."""
    import transformers

    config = transformers.ElectraConfig(
        vocab_size=modernbert_tokenizer().get_vocab_size(), embedding_size=32, hidden_size=HIDDEN,
        num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=MAX_POSITIONS, pad_token_id=1, architectures=["ElectraModel"],
    )  # fmt: skip
    model = randomize(transformers.ElectraModel(config), 0.2)
    write_sentence_transformers(folder, "mean", normalize=True)
    return save(folder, model, modernbert_tokenizer())


def build_deberta_cross_encoder(folder: Path) -> nn.Module:
    """A DeBERTa-v2 cross-encoder (relative attention; through transformers, eager)."""
    import transformers

    config = transformers.DebertaV2Config(
        vocab_size=modernbert_tokenizer().get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=MAX_POSITIONS,
        relative_attention=True, position_buckets=32, pos_att_type=["p2c", "c2p"],
        position_biased_input=False, pad_token_id=1, num_labels=1,
        architectures=["DebertaV2ForSequenceClassification"],
    )  # fmt: skip
    model = randomize(transformers.DebertaV2ForSequenceClassification(config), 0.1)
    return save(folder, model, modernbert_tokenizer())


def build_all_mpnet(folder: Path) -> nn.Module:
    """all-mpnet-base-v2's layout: an MPNetForMaskedLM checkpoint (relative position buckets, positions
    after the pad index) with mean-pooling, normalizing sentence-transformers files."""
    model = random_mpnet("MPNetForMaskedLM")
    write_sentence_transformers(folder, "mean", normalize=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": MAX_POSITIONS}))
    return save(folder, model, xlm_roberta_tokenizer()).mpnet


def build_mpnet_cross_encoder(folder: Path) -> nn.Module:
    """An MPNetForSequenceClassification reranker: <s> through the dense, tanh, out_proj head."""
    return save(folder, random_mpnet("MPNetForSequenceClassification"), xlm_roberta_tokenizer())


def random_mpnet(architecture: str) -> nn.Module:
    """A tiny random MPNet (positions after the pad index 1, XLM-R's tokenizer) whose relative position
    bias is of several units, as trained tables hold, as large as the scores."""
    import transformers

    config = transformers.MPNetConfig(
        vocab_size=xlm_roberta_tokenizer().get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=MAX_POSITIONS + 2,
        relative_attention_num_buckets=32, pad_token_id=1, bos_token_id=0, eos_token_id=2, num_labels=1,
        architectures=[architecture],
    )  # fmt: skip
    model = randomize(getattr(transformers, architecture)(config), 0.2)
    with torch.no_grad():
        model.mpnet.encoder.relative_attention_bias.weight.mul_(10.0)
    return model


def mpnet_cross_encoder_without_position_bias(folder: Path) -> nn.Module:
    model = model_class(folder).from_pretrained(folder).eval()
    with torch.no_grad():
        model.mpnet.encoder.relative_attention_bias.weight.zero_()
    return model


def mpnet_without_position_bias(folder: Path) -> nn.Module:
    model = model_class(folder).from_pretrained(folder).eval().mpnet
    with torch.no_grad():
        model.encoder.relative_attention_bias.weight.zero_()
    return model


class DenseReference(nn.Module):
    """sentence-transformers' Dense modules after an encoder, as its own classes compute them."""

    def __init__(self, encoder: nn.Module, layers: list[tuple[nn.Linear, nn.Module]]):
        super().__init__()
        self.encoder = encoder
        self.layers = layers


def build_labse(folder: Path) -> nn.Module:
    """LaBSE's layout: a BERT encoder, CLS pooling, a Dense with Tanh, Normalize; here a second Dense
    (Identity, no bias) narrows the vectors to DENSE_OUT."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=modernbert_tokenizer().get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, max_position_embeddings=MAX_POSITIONS, pad_token_id=1,
        architectures=["BertModel"],
    )  # fmt: skip
    encoder = save(folder, randomize(transformers.BertModel(config), 0.2), modernbert_tokenizer())
    write_sentence_transformers(folder, "cls", normalize=True)
    layers = write_dense_modules(folder, [(HIDDEN, True, nn.Tanh), (DENSE_OUT, False, nn.Identity)])
    return DenseReference(encoder, layers)


def write_dense_modules(folder: Path, specs: list[tuple[int, bool, type[nn.Module]]]):
    """Random sentence-transformers Dense modules (out features, bias, activation) between the pooling and
    the Normalize that write_sentence_transformers listed -> [(linear, activation)]."""
    from safetensors.torch import save_file

    modules = json.loads((folder / "modules.json").read_text())
    normalize = modules.pop()
    layers = []
    for index, (size, bias, activation) in enumerate(specs):
        path = f"{2 + index}_Dense"
        linear = nn.Linear(layers[-1][0].out_features if layers else HIDDEN, size, bias=bias)
        torch.manual_seed(10 + index)
        with torch.no_grad():
            for parameter in linear.parameters():
                parameter.normal_(0.0, 0.2)
        (folder / path).mkdir()
        name = f"torch.nn.modules.{'activation' if activation is nn.Tanh else 'linear'}.{activation.__name__}"
        dense_config = {
            "in_features": linear.in_features,
            "out_features": size,
            "bias": bias,
            "activation_function": name,
        }
        (folder / path / "config.json").write_text(json.dumps(dense_config))
        save_file(
            {f"linear.{key}": value.contiguous() for key, value in linear.state_dict().items()},
            folder / path / "model.safetensors",
        )
        modules.append(
            {
                "idx": 2 + index,
                "name": str(2 + index),
                "path": path,
                "type": "sentence_transformers.models.Dense",
            }
        )
        layers.append((linear, activation()))
    last = 2 + len(specs)
    normalize["idx"], normalize["name"], normalize["path"] = last, str(last), f"{last}_Normalize"
    (folder / "2_Normalize").rename(folder / f"{last}_Normalize")
    (folder / "modules.json").write_text(json.dumps([*modules, normalize]))
    return layers


def gemma3_config(architecture: str, tokenizer: Tokenizer, **overrides):
    """A tiny Gemma3 text model: head dim 256 and query_pre_attn_scalar as EmbeddingGemma has them, a
    sliding window shorter than every test text, two sliding layers and a full one."""
    import transformers

    return transformers.Gemma3TextConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=GEMMA3_SLIDING_WINDOW, max_position_embeddings=MAX_POSITIONS,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        pad_token_id=tokenizer.token_to_id("<pad>"), num_labels=1, architectures=[architecture], **overrides,
    )  # fmt: skip


def build_embeddinggemma(folder: Path) -> nn.Module:
    """EmbeddingGemma-300m's layout: a bidirectional Gemma3TextModel (two-sided sliding windows), mean
    pooling, two Dense modules (Identity, no bias: 64 -> 96 -> DENSE_OUT) and Normalize."""
    import transformers

    tokenizer = xlm_roberta_tokenizer()
    config = gemma3_config("Gemma3TextModel", tokenizer, use_bidirectional_attention=True)
    encoder = save(folder, randomize(transformers.Gemma3TextModel(config), 0.2), tokenizer)
    write_sentence_transformers(folder, "mean", normalize=True)
    layers = write_dense_modules(folder, [(96, False, nn.Identity), (DENSE_OUT, False, nn.Identity)])
    return DenseReference(encoder, layers)


def embeddinggemma_without_sliding_window(folder: Path) -> nn.Module:
    encoder = gemma3_without_sliding_window(folder)
    return DenseReference(encoder, dense_layers(folder))


def dense_layers(folder: Path) -> list[tuple[nn.Linear, nn.Module]]:
    """The Dense modules a folder lists, as (linear, activation), read back from their files."""
    from safetensors.torch import load_file

    layers = []
    for module in json.loads((folder / "modules.json").read_text()):
        if module["type"].endswith("Dense"):
            config = json.loads((folder / module["path"] / "config.json").read_text())
            linear = nn.Linear(config["in_features"], config["out_features"], bias=config["bias"])
            tensors = load_file(folder / module["path"] / "model.safetensors")
            linear.load_state_dict({key.removeprefix("linear."): value for key, value in tensors.items()})
            activation = nn.Tanh if config["activation_function"].endswith("Tanh") else nn.Identity
            layers.append((linear, activation()))
    return layers


def build_gemma3_cross_encoder(folder: Path) -> nn.Module:
    """A Gemma3TextForSequenceClassification reranker: causal, sliding windows, the last token through
    `score`."""
    import transformers

    tokenizer = xlm_roberta_tokenizer()
    config = gemma3_config("Gemma3TextForSequenceClassification", tokenizer)
    model = randomize(transformers.Gemma3TextForSequenceClassification(config), 0.2)
    return save(folder, model, tokenizer)


def gemma3_without_sliding_window(folder: Path) -> nn.Module:
    return model_class(folder).from_pretrained(folder, layer_types=["full_attention"] * 3).eval()


def build_gpt2(folder: Path) -> nn.Module:
    import transformers

    config = transformers.GPT2Config(vocab_size=600, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    config.architectures = ["GPT2Model"]
    return save(folder, transformers.GPT2Model(config).eval(), byte_level_bpe(["<|endoftext|>"]))


# the transformers reference: one unpadded sequence at a time


def hidden_states(model: nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """[num_tokens, hidden] final hidden states of a bare encoder."""
    input_ids = torch.tensor([list(ids)])
    with torch.inference_mode():
        return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state[0]


def bidirectional_hidden_states(model: nn.Module, ids: Sequence[int]) -> torch.Tensor:
    """[num_tokens, hidden] of a bare decoder whose layers' attentions are all non-causal, every token
    attending to every token (pplx-embed's remote model: a padding-only mask)."""
    input_ids = torch.tensor([list(ids)])
    mask = torch.ones(1, 1, len(ids), len(ids), dtype=torch.bool)
    with torch.inference_mode():
        return model(input_ids=input_ids, attention_mask={"full_attention": mask}).last_hidden_state[0]


def bidirectional_mean_vector(model: nn.Module, ids: Sequence[int]) -> np.ndarray:
    """pplx-embed's float vector: the mean of the final states, unnormalized."""
    return bidirectional_hidden_states(model, ids).mean(0).numpy()


def cls_vector(model: nn.Module, ids: Sequence[int]) -> np.ndarray:
    return F.normalize(hidden_states(model, ids)[0], dim=-1).numpy()


def last_token_vector(model: nn.Module, ids: Sequence[int]) -> np.ndarray:
    return F.normalize(hidden_states(model, ids)[-1], dim=-1).numpy()


def mean_vector(model: nn.Module, ids: Sequence[int]) -> np.ndarray:
    return hidden_states(model, ids).mean(0).numpy()


def normalized_mean_vector(model: nn.Module, ids: Sequence[int]) -> np.ndarray:
    return F.normalize(hidden_states(model, ids).mean(0), dim=-1).numpy()


def dense_cls_vector(model: DenseReference, ids: Sequence[int]) -> np.ndarray:
    return dense_vector(model, hidden_states(model.encoder, ids)[0])


def dense_mean_vector(model: DenseReference, ids: Sequence[int]) -> np.ndarray:
    return dense_vector(model, hidden_states(model.encoder, ids).mean(0))


def dense_vector(model: DenseReference, rows: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        for linear, activation in model.layers:
            rows = activation(linear(rows))
    return F.normalize(rows, dim=-1).numpy()


def classifier_logit(model: nn.Module, ids: Sequence[int]) -> float:
    input_ids = torch.tensor([list(ids)])
    with torch.inference_mode():
        return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits[0, 0].item()


def judge_probability(
    model: nn.Module, tokenizer: Tokenizer, query: str, document: str, instruction: str | None = None
) -> float:
    """Qwen3-Reranker's model card: prefix tokens + the formatted pair's tokens + suffix tokens, the
    logits of "no" and "yes" at the last position, softmax -> P(yes)."""
    pair = f"<Instruct>: {instruction or JUDGE_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
    ids = [
        *tokenizer.encode(JUDGE_PREFIX, add_special_tokens=False).ids,
        *tokenizer.encode(pair).ids,
        *tokenizer.encode(JUDGE_SUFFIX, add_special_tokens=False).ids,
    ]
    input_ids = torch.tensor([ids])
    with torch.inference_mode():
        last = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits[0, -1]
    no, yes = tokenizer.token_to_id("no"), tokenizer.token_to_id("yes")
    return torch.log_softmax(last[[no, yes]], dim=-1).exp()[1].item()


@dataclass(frozen=True, slots=True)
class Family:
    """One model family as served: how to write its checkpoint, and what transformers gives for it."""

    id: str  # the test id, and the name the server serves it as
    shaped_like: str  # the hub model whose layout the checkpoint copies
    build: Callable[[Path], nn.Module]  # writes the folder; returns the reference model on its weights
    # embedders: token ids -> the sentence-transformers vector; cross-encoders: pair ids -> the logit
    reference: Callable[[nn.Module, Sequence[int]], np.ndarray | float] | None = None
    # the reference without what sets the family apart (RoBERTa positions, pplx-embed's bidirectional
    # attention, ModernBERT's sliding window): served outputs must differ from it, so that the
    # checkpoint and texts exercise that feature
    ablated: Callable[[Path], nn.Module] | None = None
    normalized: bool = True
    matryoshka: bool = False
    min_tokens: int = 0  # every test text is longer than this (a ModernBERT sliding window)
    dimensions: int = HIDDEN  # of an embedder's vectors

    def model_args(self, folder: Path) -> tuple[str, ...]:
        """`posy serve`'s flags that serve the family's checkpoint under its id, beside others."""
        return ("--model", str(folder), "--served-model-name", self.id)


BGE_M3 = Family(
    "tiny-bge-m3", "BAAI/bge-m3", build_bge_m3, cls_vector, ablated=xlm_roberta_positions_from_zero
)
QWEN3_EMBEDDING = Family(
    "tiny-qwen3-embedding",
    "Qwen/Qwen3-Embedding-0.6B",
    build_qwen3_embedding,
    last_token_vector,
    matryoshka=True,
)
PPLX_EMBED = Family(
    "tiny-pplx-embed",
    "perplexity-ai/pplx-embed-v1",
    build_pplx_embed,
    mean_vector,
    ablated=causal_pplx_embed,
    normalized=False,
)


def build_pplx_embed_v1(folder: Path) -> nn.Module:
    from compat_tests.pplx_checkpoints import build_pplx_embed  # which builds on this module

    return build_pplx_embed(folder)


# pplx-embed-v1 as published (PPLXQwen3Model, bidirectional_pplx_qwen3, its quantizer module); its
# bidirectional attention is checked against the causal model in tests/engine/test_pplx_parity.py
PPLX_EMBED_V1 = Family(
    "tiny-pplx-embed-v1",
    "perplexity-ai/pplx-embed-v1-0.6b",
    build_pplx_embed_v1,
    bidirectional_mean_vector,
    normalized=False,
    matryoshka=True,
)
BGE_RERANKER = Family(
    "tiny-bge-reranker-v2-m3",
    "BAAI/bge-reranker-v2-m3",
    build_bge_reranker,
    classifier_logit,
    ablated=xlm_roberta_positions_from_zero,
)
# a judge, not a cross-encoder: its reference is judge_probability, which lays out its own prompt
QWEN3_RERANKER = Family("tiny-qwen3-reranker", "Qwen/Qwen3-Reranker-0.6B", build_qwen3_reranker)

# ModernBERT: texts are longer than its sliding window, so the local layers' window matters
GTE_MODERNBERT = Family(
    "tiny-gte-modernbert",
    "Alibaba-NLP/gte-modernbert-base",
    build_gte_modernbert,
    cls_vector,
    ablated=modernbert_without_sliding_window,
    min_tokens=MODERNBERT_LOCAL_ATTENTION,
)
GTE_RERANKER_MODERNBERT = Family(
    "tiny-gte-reranker-modernbert",
    "Alibaba-NLP/gte-reranker-modernbert-base",
    build_gte_reranker_modernbert,
    classifier_logit,
    ablated=modernbert_without_sliding_window,
    min_tokens=MODERNBERT_LOCAL_ATTENTION,
)

MSMARCO_DISTILBERT = Family(
    "tiny-msmarco-distilbert", "sentence-transformers/msmarco-distilbert-base-v4", build_msmarco_distilbert,
    normalized_mean_vector,
)  # fmt: skip
DISTILBERT_CROSS_ENCODER = Family(
    "tiny-distilbert-cross-encoder", "cross-encoder/ms-marco-TinyBERT-L2-v2 (a DistilBERT head)",
    build_distilbert_cross_encoder, classifier_logit,
)  # fmt: skip
CAMEMBERT = Family(
    "tiny-sentence-camembert", "dangvantuan/sentence-camembert-base", build_camembert, normalized_mean_vector,
    ablated=roberta_positions_from_zero,
)  # fmt: skip
DISTILROBERTA = Family(
    "tiny-all-distilroberta", "sentence-transformers/all-distilroberta-v1", build_distilroberta,
    normalized_mean_vector, ablated=roberta_positions_from_zero,
)  # fmt: skip
GTE_QWEN2 = Family(
    "tiny-gte-qwen2", "Alibaba-NLP/gte-Qwen2-1.5B-instruct", build_gte_qwen2, last_token_vector
)
E5_MISTRAL = Family("tiny-e5-mistral", "intfloat/e5-mistral-7b-instruct", build_e5_mistral, last_token_vector)
QWEN2_CROSS_ENCODER, QWEN3_CROSS_ENCODER, LLAMA_CROSS_ENCODER, MISTRAL_CROSS_ENCODER, GEMMA_CROSS_ENCODER = (
    Family(
        f"tiny-{name}-cross-encoder", f"a {architecture} reranker",
        partial(build_decoder_cross_encoder, config_name=config_name, architecture=architecture, **overrides),
        classifier_logit,
    )
    for name, config_name, architecture, overrides in [
        ("qwen2", "Qwen2Config", "Qwen2ForSequenceClassification", {}),
        ("qwen3", "Qwen3Config", "Qwen3ForSequenceClassification", {}),
        ("llama", "LlamaConfig", "LlamaForSequenceClassification", dict(attention_bias=True, mlp_bias=True)),
        ("mistral", "MistralConfig", "MistralForSequenceClassification", {"sliding_window": MAX_POSITIONS}),
        ("gemma", "GemmaConfig", "GemmaForSequenceClassification", {"num_key_value_heads": 1}),
    ]
)  # fmt: skip
# sentence-transformers' own CrossEncoder is the reference: it renders the chat template itself
LOGIT_SCORE_RERANKER = Family(
    "tiny-logit-score-reranker", "a sentence-transformers 6 CrossEncoder of a causal LM (LogitScore)",
    build_logit_score_reranker,
)  # fmt: skip
ELECTRA_EMBEDDER = Family(
    "tiny-electra-embedder", "an ELECTRA sentence-transformers model (the transformers fallback)",
    build_electra_embedder, normalized_mean_vector,
)  # fmt: skip
DEBERTA_CROSS_ENCODER = Family(
    "tiny-deberta-v3-cross-encoder", "cross-encoder/nli-deberta-v3-base (the transformers fallback)",
    build_deberta_cross_encoder, classifier_logit,
)  # fmt: skip
ALL_MPNET = Family(
    "tiny-all-mpnet", "sentence-transformers/all-mpnet-base-v2", build_all_mpnet,
    normalized_mean_vector, ablated=mpnet_without_position_bias,
)  # fmt: skip
LABSE = Family(
    "tiny-labse", "sentence-transformers/LaBSE", build_labse, dense_cls_vector, dimensions=DENSE_OUT
)
LLAMA_EMBEDDER = Family(
    "tiny-llama-embedder", "a LlamaModel embedder with attention and MLP biases", build_llama_embedder,
    last_token_vector,
)  # fmt: skip
MPNET_CROSS_ENCODER = Family(
    "tiny-mpnet-cross-encoder", "an MPNetForSequenceClassification reranker", build_mpnet_cross_encoder,
    classifier_logit, ablated=mpnet_cross_encoder_without_position_bias,
)  # fmt: skip
EMBEDDINGGEMMA = Family(
    "tiny-embeddinggemma", "google/embeddinggemma-300m", build_embeddinggemma, dense_mean_vector,
    ablated=embeddinggemma_without_sliding_window, min_tokens=GEMMA3_SLIDING_WINDOW, dimensions=DENSE_OUT,
)  # fmt: skip
GEMMA3_CROSS_ENCODER = Family(
    "tiny-gemma3-cross-encoder", "a Gemma3TextForSequenceClassification reranker", build_gemma3_cross_encoder,
    classifier_logit, ablated=gemma3_without_sliding_window, min_tokens=GEMMA3_SLIDING_WINDOW,
)  # fmt: skip


# the families every generic test runs over; add a family's entry here to have it checked end to end
def build_dual_encoder(folder: Path, kind: str) -> nn.Module:
    """A tiny random CLIP, SigLIP or SigLIP2 NaFlex (benchmarks/image_checkpoints.py), with its tokenizer
    and processor."""
    from benchmarks.image_checkpoints import dual_encoder_checkpoint

    return dual_encoder_checkpoint(folder, kind)[1]


def text_features(model: nn.Module, ids: Sequence[int]) -> np.ndarray:
    """A dual encoder's normalized text vector, as transformers' get_text_features gives it."""
    with torch.inference_mode():
        output = model.get_text_features(input_ids=torch.tensor([list(ids)]))
    output = output.pooler_output if hasattr(output, "pooler_output") else output
    return F.normalize(output[0], dim=-1).numpy()


# image models: texts and images, each a vector (compat_tests/test_model_families.py's own tests)
CLIP = Family(
    "tiny-clip", "openai/clip-vit-base-patch32", partial(build_dual_encoder, kind="clip"), text_features
)
SIGLIP = Family(
    "tiny-siglip", "google/siglip-base-patch16-224", partial(build_dual_encoder, kind="siglip"), text_features
)
SIGLIP2 = Family(
    "tiny-siglip2", "google/siglip2-base-patch16-naflex", partial(build_dual_encoder, kind="siglip2"),
    text_features,
)  # fmt: skip
DUAL_ENCODERS = [CLIP, SIGLIP, SIGLIP2]


def build_vision_language(folder: Path, kind: str) -> nn.Module:
    """A tiny random Qwen2-VL or Qwen3-VL (benchmarks/image_checkpoints.py), with its chat template and
    processor."""
    from benchmarks.image_checkpoints import vision_language_checkpoint

    return vision_language_checkpoint(folder, kind=kind)[1]


# vision-language embedders: texts and images in their embedders' layout (their own tests)
QWEN2_VL = Family(
    "tiny-qwen2-vl", "Alibaba-NLP/gme-Qwen2-VL-2B-Instruct", partial(build_vision_language, kind="qwen2_vl")
)
QWEN3_VL = Family(
    "tiny-qwen3-vl", "Qwen/Qwen3-VL-Embedding-2B", partial(build_vision_language, kind="qwen3_vl")
)
VISION_LANGUAGE = {"qwen2_vl": QWEN2_VL, "qwen3_vl": QWEN3_VL}


def build_colpali(folder: Path) -> nn.Module:
    """A tiny random ColPali (ColPaliForRetrieval over PaliGemma: benchmarks/image_checkpoints.py), its
    weights of half the usual noise as its own tests have them."""
    from benchmarks.image_checkpoints import colpali_checkpoint

    return colpali_checkpoint(folder, std=0.1)[1]


# a multi-vector page retriever: rerank by MaxSim, token vectors of pages (its own test)
COLPALI = Family("tiny-colpali", "vidore/colpali-v1.3-hf", build_colpali)

EMBEDDERS = [
    BGE_M3,
    QWEN3_EMBEDDING,
    PPLX_EMBED,
    PPLX_EMBED_V1,
    GTE_MODERNBERT,
    MSMARCO_DISTILBERT,
    CAMEMBERT,
    DISTILROBERTA,
    GTE_QWEN2,
    E5_MISTRAL,
    LABSE,
    ELECTRA_EMBEDDER,
    ALL_MPNET,
    EMBEDDINGGEMMA,
    LLAMA_EMBEDDER,
]
CROSS_ENCODERS = [
    BGE_RERANKER,
    GTE_RERANKER_MODERNBERT,
    DISTILBERT_CROSS_ENCODER,
    QWEN2_CROSS_ENCODER,
    QWEN3_CROSS_ENCODER,
    LLAMA_CROSS_ENCODER,
    MISTRAL_CROSS_ENCODER,
    GEMMA_CROSS_ENCODER,
    DEBERTA_CROSS_ENCODER,
    GEMMA3_CROSS_ENCODER,
    MPNET_CROSS_ENCODER,
]
