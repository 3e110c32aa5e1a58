"""Late chunking: a document's chunks read together, so that every token sees its neighbours across chunk
borders, each chunk's vector the mean of its own tokens' states (then the model's Dense and Normalize
modules). Jina's (`late_chunking` on /v1/embeddings): a request's inputs are one document's chunks, read as
[CLS] prompt chunk_1 ... chunk_n [SEP] in as few passes of the window as they fit (a chunk is never split).
Contextualized embeddings (/v1/contextualizedembeddings): each of a request's documents in one pass, its
chunks joined by the model's separator where it has one (pplx-embed-context). The special tokens, the prompt
and the separators belong to no chunk."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from api.errors import InputTooLong, InvalidInput
from api.guard import RequestGuard
from api.tokenize import TextEncoder
from engine.outputs import RowRequest


@dataclass(frozen=True, slots=True)
class Frame:
    """What a pass holds beside its chunks: the head (special tokens, then the prompt), the tail, and the
    separator between two chunks (None: they follow each other)."""

    head: tuple[int, ...]
    tail: tuple[int, ...]
    separator: int | None = None

    @classmethod
    def of(cls, encoder: TextEncoder, prompt: str, separator: int | None = None) -> Frame:
        single = encoder.single
        head = (*single.prefix.ids, *(encoder.content_ids([prompt])[0] if prompt else []))
        return cls(head, tuple(single.suffix.ids), separator)

    @property
    def num_framing(self) -> int:
        return len(self.head) + len(self.tail)

    def num_tokens(self, lengths: Sequence[int]) -> int:
        """The tokens of a pass of chunks of these lengths."""
        num_separators = len(lengths) - 1 if self.separator is not None else 0
        return self.num_framing + sum(lengths) + num_separators

    def laid_out(self, chunks: Sequence[Sequence[int]]) -> tuple[list[int], list[int], list[bool]]:
        """(the pass's token ids, where each of its spans but the first starts, whether each span is a
        chunk's): the head, the tail and each separator are spans of their own, whose rows are dropped."""
        pieces: list[tuple[Sequence[int], bool]] = [(self.head, False)] if self.head else []
        for index, chunk in enumerate(chunks):
            if index and self.separator is not None:
                pieces.append(((self.separator,), False))
            pieces.append((chunk, True))
        if self.tail:
            pieces.append((self.tail, False))
        starts = np.cumsum([len(ids) for ids, _ in pieces[:-1]]).tolist()
        return [token for ids, _ in pieces for token in ids], starts, [is_chunk for _, is_chunk in pieces]


async def read_together(
    guard: RequestGuard, frame: Frame, passes: Sequence[Sequence[Sequence[int]]]
) -> tuple[np.ndarray, int]:
    """Each pass's chunks (token ids) read in one sequence, as one request of the engine: ([chunks, dim]
    vectors in order, the tokens the model ran)."""
    sequences, spans, is_chunk = [], [], []
    for chunks in passes:
        ids, starts, owners = frame.laid_out(chunks)
        sequences.append(ids)
        spans.append(starts or None)
        is_chunk += owners
    rows = await guard.run(sequences, rows=RowRequest(spans=spans))
    return rows[np.asarray(is_chunk)], sum(map(len, sequences))


async def late_chunked_vectors(
    encoder: TextEncoder, texts: list[str], prompt: str, guard: RequestGuard, max_tokens: int, truncate: bool
) -> tuple[np.ndarray, int]:
    """Jina's: ([num_chunks, dim] vectors in input order, the tokens the model ran)."""
    frame = Frame.of(encoder, prompt)
    room = max_tokens - frame.num_framing
    if room < 1:
        raise InvalidInput(f"a token limit of {max_tokens} leaves no room beside the prompt", "input")
    texts = encoder.bounded(texts, room, truncate)
    chunks = await guard.tokenized(encoder.content_ids_off_loop(texts, guard, room))
    for index, ids in enumerate(chunks):
        if not ids:
            raise InvalidInput(f"input {index} has no tokens to pool", "input")
        if len(ids) > room:
            if not truncate:
                raise InputTooLong.of_tokens(index, frame.num_framing + len(ids), max_tokens)
            chunks[index] = ids[:room]
    groups = passes([len(ids) for ids in chunks], room)
    return await read_together(guard, frame, [[chunks[index] for index in group] for group in groups])


async def contextualized_vectors(
    encoder: TextEncoder,
    documents: list[list[str]],
    frame: Frame,
    guard: RequestGuard,
    max_request_tokens: int,
    field: str = "input",
) -> tuple[list[np.ndarray], int]:
    """Each document read in one pass of the model's window, all in one request of the engine: ([chunks,
    dim] vectors a document, the tokens the model ran). A document past the window is a 400 (read in passes
    it would not be the model's reading of it), and so is a request past `max_request_tokens` as the model
    would run them (separators and special tokens included); `field` names the documents in errors."""
    window = encoder.window
    room = window - frame.num_framing  # for a document's chunks and separators
    if room < 1:
        raise InvalidInput(f"the model's window of {window} tokens leaves no room beside the prompt", field)
    max_chars = encoder.bound.max_chars(room)
    for index, chunks in enumerate(documents):
        num_chars = sum(map(len, chunks))
        if num_chars > max_chars:  # refused untokenized: more than `room` tokens whatever they are
            raise InvalidInput(
                f"{field}[{index}] has {num_chars} characters, more than the {max_chars} that the model's "
                f"window of {window} tokens a document reads; a document is read in one pass",
                field,
            )
    texts = [chunk for chunks in documents for chunk in chunks]
    flat = await guard.tokenized(encoder.content_ids_off_loop(texts, guard, room))
    tokenized, start = [], 0
    for index, chunks in enumerate(documents):
        ids = flat[start : start + len(chunks)]
        start += len(chunks)
        for place, chunk in enumerate(ids):
            if not chunk:
                raise InvalidInput(f"{field}[{index}][{place}] has no tokens to pool", field)
        num_tokens = frame.num_tokens([len(chunk) for chunk in ids])
        if num_tokens > window:
            raise InvalidInput(
                f"{field}[{index}] has {num_tokens} tokens (its chunks, the separators and special tokens "
                f"between and around them), more than the model's window of {window} tokens a document; a "
                "document is read in one pass",
                field,
            )
        tokenized.append(ids)
    total = sum(frame.num_tokens([len(chunk) for chunk in ids]) for ids in tokenized)
    if total > max_request_tokens:
        raise InvalidInput(
            f"the request has {total} tokens as the model reads them, more than the limit of "
            f"{max_request_tokens} tokens a request",
            field,
        )
    vectors, num_tokens = await read_together(guard, frame, tokenized)
    bounds = np.cumsum([len(chunks) for chunks in documents])[:-1]
    return np.split(vectors, bounds), num_tokens


def passes(lengths: list[int], room: int) -> list[list[int]]:
    """Consecutive chunks in groups of at most `room` tokens each, in order (every length fits alone)."""
    groups: list[list[int]] = [[]]
    used = 0
    for index, length in enumerate(lengths):
        if groups[-1] and used + length > room:
            groups.append([])
            used = 0
        groups[-1].append(index)
        used += length
    return groups
