"""A large input is tokenized in parts on the encoder's threads: the same sequences, in order, as one pass,
and the same error (the earliest over-long text, named by its place in the whole request); a request
with a deadline that the threads could not start on in time is refused."""

import asyncio
import random
import threading
import time

import pytest

from api.errors import InputTooLong
from api.tokenize import INLINE_TOKENIZE_CHARS, TOKENIZE_SHARE, TextEncoder
from engine.errors import BehindDeadline
from engine.loader import resolve_model
from engine.service_rate import ServiceRate

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


def test_a_large_input_that_could_not_start_in_time_is_refused(spec):
    """The threads' measured rate and what is queued on them bound a deadlined request's wait: past
    TOKENIZE_SHARE of its time left it is refused (429) before any work; without a deadline, or with
    time enough, it runs."""
    encoder = TextEncoder(spec.tokenizer_path, spec.max_seq_length, spec.vocab_size, num_threads=2)
    large = texts(301, 60)
    num_chars = sum(map(len, large))
    try:
        now = time.perf_counter()
        # before the threads have measured, nothing is refused
        assert asyncio.run(encoder.content_ids_off_loop(large, now + 1e-3)) == encoder.content_ids(large)
        encoder.rate = ServiceRate(1)
        encoder.rate.observe(1_000, 1.0)  # 1 ms a character on one thread
        assert encoder.wait_seconds(num_chars) == pytest.approx(num_chars * 1e-3 / 2)
        soon = time.perf_counter() + num_chars * 1e-3 / 2 / TOKENIZE_SHARE * 0.9
        with pytest.raises(BehindDeadline, match="too busy to finish this request in time") as refused:
            asyncio.run(encoder.content_ids_off_loop(large, soon))
        assert refused.value.retry_after_s >= 1
        with pytest.raises(BehindDeadline):
            asyncio.run(encoder.encode_off_loop(large, None, False, deadline=soon))
        later = time.perf_counter() + num_chars * 1e-3 / 2 / TOKENIZE_SHARE * 1.5
        assert asyncio.run(encoder.encode_off_loop(large, None, False, deadline=later))
        assert asyncio.run(encoder.content_ids_off_loop(large)) == encoder.content_ids(large)
    finally:
        encoder.close()


def test_the_wait_counts_what_is_queued_on_the_threads(spec, monkeypatch):
    encoder = TextEncoder(spec.tokenizer_path, spec.max_seq_length, spec.vocab_size, num_threads=1)
    encoder.rate.observe(1_000, 1e-3)  # 1 us a character
    large = texts(301, 60)
    num_chars = sum(map(len, large))
    release = threading.Event()
    content_ids = encoder.content_ids

    def held(part):
        release.wait(10)
        return content_ids(part)

    monkeypatch.setattr(encoder, "content_ids", held)

    async def scenario():
        running = asyncio.ensure_future(encoder.content_ids_off_loop(large))
        await asyncio.sleep(0.05)
        queued = encoder.wait_seconds(0)
        release.set()
        await running
        return queued

    try:
        queued = asyncio.run(scenario())
        assert queued == pytest.approx(num_chars * 1e-6)
        assert encoder.wait_seconds(0) == 0.0  # nothing queued once it is back
    finally:
        encoder.close()
