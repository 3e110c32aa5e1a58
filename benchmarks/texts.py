"""Deterministic mixed-length benchmark texts: STS Benchmark sentences joined to target token counts."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Tokenizer

STS_TEST = Path(__file__).resolve().parents[2] / "shared" / "data" / "stsbenchmark" / "sts-test.csv"
# fmt: off
SYNTHETIC_WORDS = (
    "the", "a", "model", "server", "query", "document", "vector", "search", "fast", "small",
    "batch", "token", "every", "request", "answer", "river", "city", "mountain", "morning",
    "quiet", "engine", "paper", "table", "window", "light", "green", "old", "new", "long", "short",
    "reads", "writes", "runs", "finds", "keeps", "brings", "holds", "opens", "moves", "turns",
    "looks", "plays", "sings", "walks", "because", "while", "after", "before", "under", "over",
    "into", "from", "with", "without", "quickly", "slowly", "again", "still",
)
# fmt: on


def sts_sentences(path: Path = STS_TEST) -> list[str]:
    """Columns 6 and 7 (1-based) of the tab-separated STS Benchmark test file; [] if it is absent."""
    if not path.is_file():
        return []
    sentences: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        columns = line.split("\t")
        sentences.extend(column.strip() for column in columns[5:7] if column.strip())
    return sentences


def read_sts(path: Path = STS_TEST) -> tuple[list[float], list[str], list[str]]:
    """The STS Benchmark test file's (gold scores, first sentences, second sentences), columns 5, 6 and 7
    (1-based). Split on tabs by hand: the csv module's quoting merges rows that contain a lone quote."""
    scores, first, second = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        columns = line.split("\t")
        scores.append(float(columns[4]))
        first.append(columns[5])
        second.append(columns[6])
    return scores, first, second


def synthetic_sentences(rng: random.Random, num_sentences: int = 2000) -> list[str]:
    sentences = []
    for _ in range(num_sentences):
        words = rng.choices(SYNTHETIC_WORDS, k=rng.randint(5, 20))
        sentences.append(" ".join(words).capitalize() + ".")
    return sentences


def mixed_length_texts(
    tokenizer: Tokenizer,
    num_texts: int,
    min_tokens: int,
    max_tokens: int,
    seed: int,
    num_special_tokens: int = 2,
) -> list[str]:
    """`num_texts` texts whose token counts (specials included) are spread uniformly over
    [min_tokens, max_tokens]: random sentences joined until long enough, cut at a token boundary."""
    tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a copy: tokenizer.json may truncate or pad
    tokenizer.no_truncation()
    tokenizer.no_padding()
    rng = random.Random(seed)
    sentences = sts_sentences() or synthetic_sentences(rng)
    lengths = [len(e.ids) for e in tokenizer.encode_batch(sentences, add_special_tokens=False)]
    texts = []
    for _ in range(num_texts):
        target = rng.randint(min_tokens, max_tokens) - num_special_tokens
        parts: list[str] = []
        num_tokens = 0
        while num_tokens < target:
            index = rng.randrange(len(sentences))
            parts.append(sentences[index])
            num_tokens += lengths[index]
        text = " ".join(parts)
        encoding = tokenizer.encode(text, add_special_tokens=False)
        if len(encoding.ids) > target:
            text = text[: encoding.offsets[target - 1][1]]
        texts.append(text)
    return texts
