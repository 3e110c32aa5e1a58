"""FastBPE gives a byte-level BPE tokenizer's own ids (tiktoken's encoding in place of the tokenizers
library's), and stays off for every tokenizer whose layout or check texts say it would not."""

from __future__ import annotations

import functools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from api.fast_bpe import CHECK_TEXTS, FastBPE, layout_of
from benchmarks.seed_tokenizers import QWEN_PATTERN

CORPUS = [
    "The quick brown fox jumps over the lazy dog; it's 12:45 and we've got 3,141 reasons.",
    "Ünïcödé façade, naïve café, Straße. 中文文本的嵌入与检索。日本語のテキスト 한국어 Русский текст",
    "def tokenize(text):\n    return [ord(c) for c in text]  # code\n\n\tindented\r\n",
    "emoji 👩‍💻🚀 and   runs    of spaces, numbers 0123456789 1e-10 0x1F!!!... ---",
] * 20
SPECIAL = "<|endoftext|>"


def trained(layout: str) -> Tokenizer:
    """A byte-level BPE trained here: Qwen's layout (NFC, its regex Split, ByteLevel without regex) or
    GPT-2's (ByteLevel with its regex), with one added special token."""
    tokenizer = Tokenizer(models.BPE())
    if layout == "qwen":
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[SPECIAL]
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


TOKENIZERS = {layout: trained(layout) for layout in ("qwen", "gpt2")}


def reference(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [encoding.ids for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


@pytest.mark.parametrize("layout", ["qwen", "gpt2"])
def test_a_byte_level_bpe_gets_tiktokens_encoding_with_its_own_ids(layout):
    tokenizer = TOKENIZERS[layout]
    fast = FastBPE.of(tokenizer)
    assert fast is not None
    texts = [
        *CHECK_TEXTS, *CORPUS[:4], "",
        f"text around {SPECIAL} a special token", SPECIAL, f"a<{SPECIAL}>b",
        "e\u0301 decomposed: NFC makes it one character", "\u212b angstrom sign",
    ]  # fmt: skip
    assert fast.content_ids(texts) == reference(tokenizer, texts)


@pytest.mark.parametrize("layout", ["qwen", "gpt2"])
@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80))
def test_any_text_gets_the_tokenizers_ids(layout, text):
    assert fast_of(layout).content_ids([text]) == reference(TOKENIZERS[layout], [text])


@functools.cache
def fast_of(layout: str) -> FastBPE:
    fast = FastBPE.of(TOKENIZERS[layout])
    assert fast is not None
    return fast


def edited(tokenizer: Tokenizer, edit) -> dict:
    """The tokenizer's tokenizer.json, edited."""
    config = json.loads(tokenizer.to_str())
    edit(config)
    return config


def swap_two_merges(config: dict) -> None:
    merges = config["model"]["merges"]
    merges[10], merges[200] = merges[200], merges[10]


@pytest.mark.parametrize(
    "edit",
    [
        lambda config: config["model"].update(dropout=0.1),
        lambda config: config.update(normalizer={"type": "Lowercase"}),
        lambda config: config["pre_tokenizer"]["pretokenizers"][1].update(add_prefix_space=True),
        lambda config: config["model"].update(continuing_subword_prefix="##"),
        swap_two_merges,
    ],
    ids=["dropout", "lowercase", "prefix space", "subword prefix", "merges out of rank order"],
)
def test_a_layout_tiktoken_would_encode_otherwise_keeps_the_tokenizers_library(edit):
    assert layout_of(json.loads(TOKENIZERS["qwen"].to_str())) is not None
    assert layout_of(edited(TOKENIZERS["qwen"], edit)) is None


def test_the_bundled_wordpiece_tokenizer_keeps_the_tokenizers_library():
    from engine.checkpoint.resolve import resolve_model

    spec = resolve_model(None)
    assert FastBPE.of(Tokenizer.from_file(str(spec.tokenizer_path))) is None


def test_disagreeing_on_the_check_texts_keeps_the_tokenizers_library(monkeypatch):
    """A layout that passes the structural checks yet encodes a check text otherwise stays off."""
    tokenizer = TOKENIZERS["qwen"]
    monkeypatch.setattr(
        FastBPE, "content_ids", lambda self, texts: [ids + [0] for ids in reference(tokenizer, list(texts))]
    )
    assert FastBPE.of(tokenizer) is None


def test_a_gateway_tokenizes_a_byte_level_bpe_models_texts_with_it(tmp_path):
    """TextEncoder (every route's tokenization) takes FastBPE for such a tokenizer: same ids, the texts past
    its window refused or cut as before."""
    from api.tokenize import TextEncoder

    tokenizer = TOKENIZERS["qwen"]
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    encoder = TextEncoder(tmp_path / "tokenizer.json", window=64, vocab_size=tokenizer.get_vocab_size())
    assert encoder.fast_bpe is not None
    texts = [CORPUS[1], CORPUS[2] * 5]
    expected = [ids[:64] for ids in reference(tokenizer, texts)]
    assert encoder.encode(texts, None, truncate=True) == expected
