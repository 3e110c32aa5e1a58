"""A large input is tokenized in parts on the encoder's threads: the same sequences, in order, as one pass,
and the same error (the earliest over-long text, named by its place in the whole request)."""

import asyncio
import random

import pytest

from api.errors import InputTooLong
from api.tokenize import INLINE_TOKENIZE_CHARS, TextEncoder
from engine.checkpoint.resolve import resolve_model

WORDS = "the cat sat on a mat while stocks fell and rain came down over the quiet harbour".split()


@pytest.fixture(scope="module")
def spec():
    return resolve_model(None)  # the bundled all-MiniLM-L6-v2


def texts(count: int, num_words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, num_words))) for _ in range(count)]


@pytest.mark.parametrize("num_threads", [1, 2, 3, 7])
def test_parts_join_to_one_pass(spec, num_threads):
    encoder = TextEncoder(spec.tokenizer_path, spec.max_seq_length, spec.vocab_size, num_threads=num_threads)
    large = texts(301, 60)
    assert sum(map(len, large)) > INLINE_TOKENIZE_CHARS  # so that it is split
    try:
        split = asyncio.run(encoder.encode_off_loop(large, None, False))
        content = asyncio.run(encoder.content_ids_off_loop(large))
    finally:
        encoder.close()
    assert split == encoder.encode(large, None, False)
    assert content == encoder.content_ids(large)


def test_the_earliest_over_long_text_is_named(spec):
    encoder = TextEncoder(spec.tokenizer_path, spec.max_seq_length, spec.vocab_size, num_threads=4)
    large = texts(400, 60)
    long_text = " ".join(["cat"] * 600)
    large[250] = large[390] = long_text  # in the third and the fourth part
    try:
        with pytest.raises(InputTooLong, match="^input 250 has 602 tokens"):
            asyncio.run(encoder.encode_off_loop(large, None, False))
        truncated = asyncio.run(encoder.encode_off_loop(large, None, True))
    finally:
        encoder.close()
    assert len(truncated[250]) == len(truncated[390]) == spec.max_seq_length
    assert truncated == encoder.encode(large, None, True)


def test_a_text_far_past_the_window_is_cut_or_refused_by_its_characters(spec):
    """A text past the characters of its window (api/char_bound.py) is refused untokenized, or cut to
    them, which truncates to the same ids as the whole text gives, either end (tests/api/test_char_bound.py
    holds the cut to that over other tokenizers and texts)."""
    encoder = TextEncoder(spec.tokenizer_path, spec.max_seq_length, spec.vocab_size)
    long = " ".join(texts(4000, 60, seed=1))
    room = spec.max_seq_length - 2
    assert len(long) > encoder.bound.max_chars(room)
    with pytest.raises(InputTooLong, match="^input 1 has [0-9]+ characters, more than the 25600 that"):
        encoder.encode(["short", long], None, truncate=False)
    full = encoder.tokenizer.encode(long, add_special_tokens=False).ids
    for keep_end, kept in ((False, full[:room]), (True, full[-room:])):
        [ids] = encoder.encode([long], None, truncate=True, keep_end=keep_end)
        assert ids[1:-1] == kept
    # within them, it is tokenized whole: one huge word is one [UNK] token
    [ids] = encoder.encode(["x" * 20_000], None, truncate=False)
    assert len(ids) == 3
