"""Late chunking (as Jina's embeddings API offers it): a request's inputs are the consecutive chunks of
one document. The model reads them together, [CLS] prompt chunk_1 ... chunk_n [SEP] in as few passes of
its window as they fit (a chunk is never split), so that every token sees its neighbours across chunk
borders; each chunk's vector is the mean of its own tokens' states (then the model's Dense and Normalize
modules). The special tokens and the prompt belong to no chunk."""

from __future__ import annotations

import numpy as np

from api.errors import InputTooLong, InvalidInput
from api.guard import RequestGuard
from api.tokenize import TextEncoder
from engine.outputs import RowRequest


async def late_chunked_vectors(
    encoder: TextEncoder, texts: list[str], prompt: str, guard: RequestGuard, max_tokens: int, truncate: bool
) -> tuple[np.ndarray, int]:
    """([num_chunks, dim] vectors in input order, the tokens the model ran)."""
    single = encoder.single
    head = [*single.prefix.ids, *(encoder.content_ids([prompt])[0] if prompt else [])]
    tail = list(single.suffix.ids)
    room = max_tokens - len(head) - len(tail)
    if room < 1:
        raise InvalidInput(f"a token limit of {max_tokens} leaves no room beside the prompt", "input")
    texts = encoder.bounded(texts, room, truncate)
    chunks = await guard.tokenized(encoder.content_ids_off_loop(texts, guard, room))
    for index, ids in enumerate(chunks):
        if not ids:
            raise InvalidInput(f"input {index} has no tokens to pool", "input")
        if len(ids) > room:
            if not truncate:
                raise InputTooLong.of_tokens(index, len(head) + len(ids) + len(tail), max_tokens)
            chunks[index] = ids[:room]
    sequences, spans, kept = [], [], []  # kept: each pass's rows that are chunks'
    for group in passes([len(ids) for ids in chunks], room):
        starts = np.cumsum([len(head), *(len(chunks[index]) for index in group)]).tolist()
        # spans: the head (if any), each chunk, the tail (if any)
        boundaries = ([len(head)] if head else []) + starts[1:-1] + ([starts[-1]] if tail else [])
        sequences.append([*head, *(token for index in group for token in chunks[index]), *tail])
        spans.append(boundaries or None)
        kept.append((1 if head else 0, len(group)))
    rows = await guard.run(sequences, rows=RowRequest(spans=spans))
    vectors, row = [], 0
    for (skip, count), boundaries in zip(kept, spans):
        vectors.append(rows[row + skip : row + skip + count])
        row += 1 if boundaries is None else len(boundaries) + 1
    return np.concatenate(vectors), sum(map(len, sequences))


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
