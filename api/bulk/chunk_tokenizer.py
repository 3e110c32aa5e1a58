"""A bulk job's chunk tokenizers: chunks of texts -> model inputs (prompt, truncation to the window,
special tokens), in a thread of the job's process (CPU engines, whose cores the model needs) or in worker
processes (GPU engines: a tokenizer's output turned into Python ints holds the GIL for about 5 us a text,
which at the H200's 50,000 texts/s would starve the engine's own thread of it)."""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import multiprocessing.connection
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from api.bulk.errors import TokenizerFailed
from api.tokenize import TextEncoder
from engine.checkpoint.colbert import ColbertConfig
from engine.checkpoint.spec import InputLayout
from scoring.late_interaction import LateInteraction

MAX_DEFAULT_PROCESSES = 8  # 4 kept the H200 fed with 50-token texts (bulk suite); room for costlier texts


@dataclass(frozen=True, slots=True)
class Tokenization:
    """How a job's texts become model inputs; each worker builds its TextEncoder from it."""

    tokenizer_path: Path
    window: int
    vocab_size: int
    prompt: str
    colbert: ColbertConfig | None = None  # a ColBERT model's layout of its queries and documents
    is_query: bool = False  # ColBERT: the texts are queries
    padding: tuple[int, int] | None = None  # ModelSpec.text_padding (SigLIP's texts)
    input_layout: InputLayout | None = None  # ModelSpec.input_layout (a vision-language embedder's)

    def encoder(self) -> TextEncoder:
        return TextEncoder(
            self.tokenizer_path, self.window, self.vocab_size, padding=self.padding,
            input_layout=self.input_layout,
        )  # fmt: skip

    def encode(self, encoder: TextEncoder, texts: Sequence[str]) -> list[list[int]]:
        """Texts over the window are truncated to it, as sentence-transformers does, each in the model's
        layout as the server lays it out (its prompt, SigLIP's padding, a vision-language embedder's chat
        layout); a ColBERT model's are laid out as its queries or documents (marker, length, a query's
        expansion), as the server's."""
        if self.colbert is None:
            prompted_encoder, prompted = encoder.prompted(texts, self.prompt)
            return prompted_encoder.encode(prompted, self.window, True)
        prompted = [self.prompt + text for text in texts] if self.prompt else texts
        late = LateInteraction.build(self.colbert, encoder.single, encoder.content_ids)
        layout = late.query_ids if self.is_query else late.document_ids
        bounded = encoder.bounded(prompted, late.content_room(self.is_query))
        laid_out = [late.laid_out_text(text, self.is_query) for text in bounded]  # ColQwen2's text layout
        return [layout(ids) for ids in encoder.content_ids(laid_out)]


class ChunkTokenizer(Protocol):
    lookahead: int  # chunks tokenizing at once beyond the one the job waits for

    def submit(self, texts: Sequence[str]) -> asyncio.Future[Sequence[Sequence[int]]]: ...

    def close(self) -> None: ...


def default_num_processes(device: str) -> int:
    if device == "cpu":
        return 0
    return min(MAX_DEFAULT_PROCESSES, max(2, (os.cpu_count() or 2) // 2))


def open_chunk_tokenizer(tokenization: Tokenization, num_processes: int) -> ChunkTokenizer:
    """0 processes: a thread of this process."""
    if num_processes < 0:
        raise ValueError(f"--tokenizer-processes must be 0 or more, not {num_processes}")
    if num_processes == 0:
        return ThreadTokenizer(tokenization)
    return ProcessTokenizer(tokenization, num_processes)


class ThreadTokenizer:
    lookahead = 1

    def __init__(self, tokenization: Tokenization):
        self.tokenization = tokenization
        self.encoder = tokenization.encoder()

    def submit(self, texts: Sequence[str]) -> asyncio.Future[Sequence[Sequence[int]]]:
        return asyncio.ensure_future(asyncio.to_thread(self.tokenization.encode, self.encoder, texts))

    def close(self) -> None:
        pass


class ProcessTokenizer:
    """Worker processes, each single-threaded, that send a chunk back as one flat array of ids and its
    lengths; the chunk's sequences are views of that array (the engine packs them without a Python int)."""

    def __init__(self, tokenization: Tokenization, num_processes: int):
        # spawned, not forked: this process runs threads (and CUDA) that a fork would copy mid-step
        self.pool = ProcessPoolExecutor(
            num_processes,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(tokenization,),
        )
        self.lookahead = 2 * num_processes
        for _ in range(num_processes):  # started now, while the job loads its model, not at its first chunk
            self.pool.submit(int)

    def submit(self, texts: Sequence[str]) -> asyncio.Future[Sequence[Sequence[int]]]:
        return asyncio.ensure_future(self._encode(list(texts)))

    async def _encode(self, texts: list[str]) -> list[np.ndarray]:
        try:
            flat, lengths = await asyncio.wrap_future(self.pool.submit(_encode_in_worker, texts))
        except BrokenProcessPool as error:
            raise TokenizerFailed(f"a tokenizer process died: {error}") from error
        ends = np.cumsum(lengths).tolist()
        return [flat[start:end] for start, end in zip([0, *ends[:-1]], ends)]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass(slots=True)
class _Worker:
    tokenization: Tokenization
    encoder: TextEncoder


_worker: _Worker | None = None  # a worker process's own tokenizer, set once by its initializer


def _start_worker(tokenization: Tokenization) -> None:
    import signal

    global _worker
    # the job's process handles Ctrl-C (the whole terminal group gets it) and shuts the pool down
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core a worker; the pool is the parallelism
    _worker = _Worker(tokenization, tokenization.encoder())
    parent = multiprocessing.parent_process()
    if parent is not None:  # a job killed with -9 cannot shut its pool down: its workers follow it
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _exit_with(parent_sentinel: int) -> None:
    multiprocessing.connection.wait([parent_sentinel])
    os._exit(0)


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    assert _worker is not None, "the pool's initializer sets the worker up"
    sequences = _worker.tokenization.encode(_worker.encoder, texts)
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    flat = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int32, count=int(lengths.sum()))
    return flat, lengths
