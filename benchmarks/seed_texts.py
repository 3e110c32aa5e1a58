"""Texts of a given token count under a real tokenizer: random words of its own vocabulary (each one token
as a word of its own), then trimmed to the count; and token-id sequences of a given length."""

from __future__ import annotations

import random
import re

WORD = re.compile(r"[a-z]{3,10}")
WORD_STARTS = ("\u0120", "\u2581")  # byte-level BPE's and SentencePiece's word-start marks
MIN_WORDS = 1000


class TextMaker:
    """Texts for one tokenizer; `num_specials`: what its template adds to a text."""

    def __init__(self, tokenizer, num_specials: int, rng: random.Random):
        self.tokenizer, self.num_specials, self.rng = tokenizer, num_specials, rng
        self.words = sorted(
            token[1:]
            for token in tokenizer.get_vocab()
            if token[:1] in WORD_STARTS and WORD.fullmatch(token[1:])
        )
        numbered = [token for token in tokenizer.get_vocab() if re.fullmatch(r"w\d+", token)]
        if len(self.words) < MIN_WORDS and numbered:  # a word tokenizer (smoke runs): its own "w123" words
            self.words = numbered

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)

    def text(self, num_tokens: int) -> str:
        """A text of `num_tokens` tokens with the template's special tokens (one or two under, at worst)."""
        words = [self.rng.choice(self.words) for _ in range(num_tokens - self.num_specials)]
        while len(words) > 1 and self.count(" ".join(words)) > num_tokens:
            words = words[: len(words) - max(1, (self.count(" ".join(words)) - num_tokens) // 2)]
        return " ".join(words)

    def texts(self, num_tokens: int, count: int) -> list[str]:
        return [self.text(num_tokens) for _ in range(count)]


def token_ids(num_tokens: int, vocab_size: int, rng: random.Random, first: int = 5) -> list[int]:
    """A pre-tokenized input of `num_tokens` ids above the special tokens."""
    return [rng.randrange(first, vocab_size) for _ in range(num_tokens)]
