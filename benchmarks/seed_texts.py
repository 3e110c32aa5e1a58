"""Texts of a given token count under a real tokenizer, and token-id sequences of a given length.

A text is English prose where sentences are given (the STS Benchmark's, which the seed suite carries to
the GPU machine beside its tokenizers): consecutive sentences from a random place, trimmed to the count.
Without them it is random words of the tokenizer's own vocabulary, each one token as a word of its own;
those cost a tokenizer about three times prose's time a token (XLM-R's Unigram: 7.5 against 2.4 us, its
cache missing on every word), so a suite that times tokenization says which it used (`describe`)."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

WORD = re.compile(r"[a-z]{3,10}")
WORD_STARTS = ("\u0120", "\u2581")  # byte-level BPE's and SentencePiece's word-start marks
MIN_WORDS = 1000


class TextMaker:
    """Texts for one tokenizer; `num_specials`: what its template adds to a text; `sentences`: prose to
    build them from (none: vocabulary words)."""

    def __init__(self, tokenizer, num_specials: int, rng: random.Random, sentences: Sequence[str] = ()):
        self.tokenizer, self.num_specials, self.rng = tokenizer, num_specials, rng
        self.sentences = list(sentences)
        self._sentence_tokens: dict[int, int] = {}  # sentence index -> its tokens, counted once
        self.words = sorted(
            token[1:]
            for token in tokenizer.get_vocab()
            if token[:1] in WORD_STARTS and WORD.fullmatch(token[1:])
        )
        numbered = [token for token in tokenizer.get_vocab() if re.fullmatch(r"w\d+", token)]
        if len(self.words) < MIN_WORDS and numbered:  # a word tokenizer (smoke runs): its own "w123" words
            self.words = numbered

    @staticmethod
    def describe(sentences: Sequence[str]) -> str:
        return "English prose (STS Benchmark sentences)" if sentences else "random vocabulary words"

    def count(self, text: str) -> int:
        """The text's tokens with the template's special tokens (num_specials, not the tokenizer's own)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids) + self.num_specials

    def text(self, num_tokens: int) -> str:
        """A text of `num_tokens` tokens with the template's special tokens (one or two under, at worst)."""
        words = self._prose(num_tokens) if self.sentences else self._vocabulary(num_tokens)
        while len(words) > 1 and self.count(" ".join(words)) > num_tokens:
            words = words[: len(words) - max(1, (self.count(" ".join(words)) - num_tokens) // 2)]
        return " ".join(words)

    def texts(self, num_tokens: int, count: int) -> list[str]:
        return [self.text(num_tokens) for _ in range(count)]

    def _vocabulary(self, num_tokens: int) -> list[str]:
        return [self.rng.choice(self.words) for _ in range(num_tokens - self.num_specials)]

    def _prose(self, num_tokens: int) -> list[str]:
        """Words of consecutive sentences (from a random one, wrapping around), cut after the token that
        makes `num_tokens` (a word or so over, which text() trims)."""
        index, total, chosen = self.rng.randrange(len(self.sentences)), self.num_specials, []
        while total <= num_tokens:
            if index not in self._sentence_tokens:
                self._sentence_tokens[index] = self.count(self.sentences[index]) - self.num_specials
            chosen.append(self.sentences[index])
            total += self._sentence_tokens[index]
            index = (index + 1) % len(self.sentences)
        text = " ".join(chosen)
        keep = max(1, num_tokens - self.num_specials)
        offsets = self.tokenizer.encode(text, add_special_tokens=False).offsets
        return (text[: offsets[keep - 1][1]] if len(offsets) > keep else text).split()


def token_ids(num_tokens: int, vocab_size: int, rng: random.Random, first: int = 5) -> list[int]:
    """A pre-tokenized input of `num_tokens` ids above the special tokens."""
    return [rng.randrange(first, vocab_size) for _ in range(num_tokens)]
