"""Long documents -> windows that fit the model; a document scores the max of its chunks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def split_into_chunks(
    ids: Sequence[int],
    chunk_len: int,
    max_chunks: int | None = None,
    lead: Sequence[int] = (),
    closing: Sequence[int] = (),
) -> list[Sequence[int]]:
    """Consecutive windows of at most `chunk_len` tokens; an empty document is one empty chunk. `lead`:
    the tokens a document's text starts with (its prompt, a template's ">:"); every chunk after the first
    starts with them too, as the first does, where they leave room for a token of the document. `closing`:
    the tokens a laid-out text ends with (ColQwen2's ten pads and a newline); where the document ends with
    them, every chunk before the last ends with them too, where they leave room for a token of it."""
    if chunk_len < 1:
        raise ValueError("chunk_len must be at least 1")
    closing = tuple(closing)
    if closing and len(ids) > chunk_len and chunk_len > len(lead) + len(closing):
        if tuple(ids[-len(closing) :]) == closing:
            body = split_into_chunks(ids[: -len(closing)], chunk_len - len(closing), max_chunks, lead)
            return [[*chunk, *closing] for chunk in body]
    if chunk_len <= len(lead):
        lead = ()
    step = chunk_len - len(lead)  # the first chunk holds its lead already
    starts = range(chunk_len, len(ids), step)
    chunks = [
        ids[:chunk_len],
        *([*lead, *ids[start : start + step]] if lead else ids[start : start + step] for start in starts),
    ]
    return chunks[:max_chunks] if max_chunks is not None else chunks


def max_over_chunks(chunk_scores: np.ndarray, chunk_owner: np.ndarray, num_docs: int) -> np.ndarray:
    """[num_chunks] scores + the document of each chunk -> [num_docs] best score per document."""
    best = np.full(num_docs, -np.inf, dtype=np.float64)
    np.maximum.at(best, chunk_owner, chunk_scores.astype(np.float64))
    return best
