"""A bulk job's chunk tokenizers on the bundled model's tokenizer: worker processes give the same model
inputs as the in-process thread (prompt, truncation to the window, special tokens), as views the engine
packs; a worker that dies is a TokenizerFailed; a negative process count is refused."""

import asyncio
import dataclasses
import os

import numpy as np
import pytest

from api.bulk.chunk_tokenizer import Tokenization, default_num_processes, open_chunk_tokenizer
from api.bulk.errors import TokenizerFailed
from engine.checkpoint.colbert import ColbertConfig
from engine.checkpoint.resolve import resolve_model
from scoring.late_interaction import LateInteraction
from tests.api.test_char_bound import recorded

WINDOW = 16
TEXTS = ["a short text", "", "one " * 40, "ünïcödé and emoji 🙂 text", "a short text"]


@pytest.fixture(scope="module")
def tokenization():
    spec = resolve_model(None)  # the bundled all-MiniLM-L6-v2
    return Tokenization(spec.tokenizer_path, WINDOW, spec.vocab_size, prompt="query: ")


def encode_with(tokenizer, texts):
    async def chunks():
        return await asyncio.gather(tokenizer.submit(texts[:3]), tokenizer.submit(texts[3:]))

    try:
        return [sequence for chunk in asyncio.run(chunks()) for sequence in chunk]
    finally:
        tokenizer.close()


def test_worker_processes_give_the_threads_model_inputs(tokenization):
    in_thread = encode_with(open_chunk_tokenizer(tokenization, 0), TEXTS)
    in_processes = encode_with(open_chunk_tokenizer(tokenization, 2), TEXTS)
    assert [list(map(int, ids)) for ids in in_processes] == in_thread
    assert all(isinstance(ids, np.ndarray) for ids in in_processes)
    encoder = tokenization.encoder()
    assert in_thread[0] == encoder.encode(["query: a short text"], None, False)[0]  # the prompt is in
    assert len(in_thread[2]) == WINDOW and in_thread[2][-1] == in_thread[0][-1]  # cut, [SEP] kept


def test_a_negative_process_count_is_refused(tokenization):
    with pytest.raises(ValueError, match="--tokenizer-processes"):
        open_chunk_tokenizer(tokenization, -1)


def test_processes_only_beside_a_gpu_engine():
    assert default_num_processes("cpu") == 0
    assert 2 <= default_num_processes("cuda") <= 8


def test_a_tokenizer_process_that_dies_fails_the_chunk_with_tokenizer_failed(tokenization):
    tokenizer = open_chunk_tokenizer(tokenization, 1)
    try:
        tokenizer.pool.submit(os._exit, 9).exception(timeout=60)  # as the kernel's OOM killer would
        with pytest.raises(TokenizerFailed, match="a tokenizer process died"):
            encode_with(tokenizer, TEXTS)
    finally:
        tokenizer.close()


def test_a_7m_character_word_is_cut_before_it_is_tokenized(tokenization):
    """posy embed's texts are bounded as the server's (api/char_bound.py): the tokenizer reads what the
    window can span, and the ids are the whole text's truncated, a ColBERT model's laid out too."""
    spaceless = "a" * 7_000_000
    colbert = ColbertConfig(1, 2, 8, WINDOW, 103, False, frozenset(), None)
    whole = None  # the whole text's ids, the same for both layouts (some 6 s to tokenize on a 2-core host)
    for layout in (tokenization, dataclasses.replace(tokenization, colbert=colbert)):
        encoder = layout.encoder()
        seen = recorded(encoder)
        [ids] = layout.encode(encoder, [spaceless])
        assert max(seen) <= encoder.bound.max_chars(WINDOW)
        if whole is None:
            whole = encoder.tokenizer.encode("query: " + spaceless, add_special_tokens=False).ids
        if layout.colbert is None:
            assert ids == encoder.single.apply(whole[: WINDOW - 2])
        else:
            assert ids == LateInteraction(colbert, encoder.single).document_ids(whole)
