"""The bundled all-MiniLM-L6-v2 through the packed engine vs sentence-transformers; fp32, cosine >= 0.9999."""

import random

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.weights import load_model

LONG = " ".join(
    [
        "Packed",
        "batches",
        "lay",
        "every",
        "sequence",
        "end",
        "to",
        "end,",
        "so",
        "no",
        "token",
        "is",
        "ever",
        "padding",
        "and",
        "attention",
        "runs",
        "over",
        "each",
        "segment",
        "alone;",
        "a",
        "long",
        "document",
        "is",
        "cut",
        "at",
        "the",
        "model",
        "window.",
    ]
    * 12
)
TEXTS = [
    "a",
    "Hello, world!",
    "Café au lait, naïve façade, Ångström, jalapeño.",
    "東京は日本の首都です。北京是中国的首都。",
    "Emoji mix 🙂🚀🔥 and symbols ∑∫√ ≠ ≤.",
    "Ünïcödé ÀÉÎÕÜ àéîõü ß ø œ",
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog.",
    LONG,
    LONG[: len(LONG) // 3],
    "   leading and trailing spaces   ",
    "12345 67890 3.14159 -2.71828",
]
TOLERANCE = 0.9999  # cosine, fp32 ("same vector" in DESIGN.md)


@pytest.fixture(scope="module")
def spec():
    return resolve_model(None)


@pytest.fixture(scope="module")
def model(spec):
    return load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))


@pytest.fixture(scope="module")
def tokenizer(spec):
    # tokenizer.json ships padding to 128 and truncation at 128; sentence-transformers uses the 256 window
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(spec.max_seq_length)
    return tokenizer


@pytest.fixture(scope="module")
def reference(spec):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(spec.path), device="cpu")


def embed(model, tokenizer, texts):
    batch = pack([encoding.ids for encoding in tokenizer.encode_batch(texts)])
    with torch.inference_mode():
        return model(batch)


def test_matches_sentence_transformers(model, tokenizer, reference):
    lengths = [len(encoding.ids) for encoding in tokenizer.encode_batch(TEXTS)]
    assert max(lengths) == 256 and min(lengths) == 3  # the window and "a" are both covered
    ours = embed(model, tokenizer, TEXTS)
    expected = reference.encode(TEXTS, convert_to_tensor=True, batch_size=len(TEXTS)).float()
    assert ours.dtype == torch.float32 and ours.shape == expected.shape == (len(TEXTS), 384)
    cosines = F.cosine_similarity(ours, expected)
    assert cosines.min().item() >= TOLERANCE, cosines
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(TEXTS)))  # normalized, as configured


def test_vector_does_not_depend_on_the_batch(model, tokenizer):
    generator = random.Random(0)
    words = LONG.split() + TEXTS[:8]
    texts = [" ".join(generator.choices(words, k=generator.randint(1, 120))) for _ in range(64)]
    text = "Does this vector change with its neighbours?"
    texts[0] = texts[37] = texts[63] = text  # first, middle (between other lengths) and last
    alone = embed(model, tokenizer, [text])[0]
    in_batch = embed(model, tokenizer, texts)
    for position in (0, 37, 63):
        assert F.cosine_similarity(alone, in_batch[position], dim=0).item() >= TOLERANCE


def test_bfloat16_is_the_same_vector(spec, tokenizer, reference):
    model = load_model(spec, "cpu", torch.bfloat16, select_backend("torch", "cpu"))
    ours = embed(model, tokenizer, TEXTS)
    assert ours.dtype == torch.float32
    expected = reference.encode(TEXTS, convert_to_tensor=True, batch_size=len(TEXTS)).float()
    assert F.cosine_similarity(ours, expected).min().item() >= 0.999  # bf16 vs the fp32 reference
