"""CharBound: the characters that a number of a tokenizer's tokens can span, so that every text is cut (or
refused) by its length before the tokenizer reads it, and what a request's tokenization costs follows the
model's window, not the text's bytes (eight 7 MB texts without a space took 12 to 24 s and 790 MiB)."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

# at least this many characters a token: real text averages 4 to 5 a token, whitespace and the other
# characters a tokenizer drops included; the rest is room for text far from the average
MIN_CHARS_PER_TOKEN = 64
# tokens a cut's characters hold beyond those asked for: a word that the cut splits may tokenize otherwise
# at the cut's end
CUT_MARGIN_TOKENS = 2
# a cut backs off to a space this near its end, so that it splits no word where the text has spaces
SPACE_SEARCH_CHARS = 256


@dataclass(frozen=True, slots=True)
class CharBound:
    """Why a cut text's first tokens are the whole text's: tokens never cross a space (every tokenizer's
    pre-tokenizer splits words there, and a BPE's space goes with the word after it), so a text cut at a
    space tokenizes as the whole text's start. Cut inside a word (no space within SPACE_SEARCH_CHARS of the
    cut), only that word's last tokens can change: a WordPiece word that long is one [UNK] either way, and
    BPE and Unigram split a word from its start. No token spans more than `chars_per_token` characters, so
    max_chars(n) characters hold n tokens before the margin. What a cut cannot keep: tokens past one that
    spans more (an [UNK] word past max_input_chars_per_word, a Unigram run of unknown characters, long runs
    of what the tokenizer drops, as whitespace is to WordPiece), and, keeping a word's end, where a BPE
    aligns a long run of one repeated character from the word's start (its last tokens)."""

    chars_per_token: int

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> CharBound:
        """The longest entry of the tokenizer's vocabulary (a byte-level entry's length is its bytes, at
        least its characters) or of a WordPiece word read as one [UNK] (max_input_chars_per_word), and at
        least MIN_CHARS_PER_TOKEN."""
        longest = max(map(len, tokenizer.get_vocab(with_added_tokens=True)), default=0)
        unknown_word = getattr(tokenizer.model, "max_input_chars_per_word", 0)
        return cls(max(MIN_CHARS_PER_TOKEN, longest, unknown_word))

    def max_chars(self, num_tokens: int) -> int:
        return (num_tokens + CUT_MARGIN_TOKENS) * self.chars_per_token

    def cut(self, text: str, num_tokens: int, keep_end: bool = False) -> str:
        """The text, or past max_chars(num_tokens) its first that many characters (its last, with
        `keep_end`) less a word the cut would split: its first (last) num_tokens tokens are the whole
        text's."""
        budget = self.max_chars(num_tokens)
        if len(text) <= budget:
            return text
        if keep_end:
            part = text[-budget:]
            space = part.find(" ", 0, SPACE_SEARCH_CHARS)
            return part[space + 1 :] if space >= 0 else part
        part = text[:budget]
        space = part.rfind(" ", budget - SPACE_SEARCH_CHARS)
        return part[:space] if space > 0 else part
