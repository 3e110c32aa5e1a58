"""What a head gives and what a request asks of it, each said once. A head declares its HeadOutput (which
rows, how wide, the tasks they serve, what a request may ask of them); a request carries a RowRequest (the
prefix its sequences continue or are scored against, the spans pooled apart, its first rows only, the
columns it keeps). The engine, its CUDA graphs, pack, the replicas and the routes read these two, never a
head's own attributes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import numpy as np

# which rows a head gives
SEQUENCE = "sequence"  # a row a sequence (pooled)
TOKEN = "token"  # a row a token
MARKER = "marker"  # a row at each token of HeadOutput.row_tokens

# the tasks a head's rows serve (the routes that serve them: api/models.py)
EMBED = "embed"  # a vector a text
RERANK = "rerank"  # a relevance a (query, document) pair
TOKEN_EMBED = "token_embed"  # a vector a token (ColBERT; bge-m3's ColBERT vectors)
SPARSE_EMBED = "sparse_embed"  # vocabulary weights a text (SPLADE; bge-m3's lexical weights)
CLASSIFY = "classify"  # a sequence classifier's labels


class TaskRows(msgspec.Struct, frozen=True, array_like=True):
    """The rows a task reads where they are not all of them: each sequence's first row only, and of each
    row the columns [start, stop) (bge-m3's dense vector: its first row, less the lexical weight)."""

    first_rows: bool = False
    columns: tuple[int, int] | None = None


class HeadOutput(msgspec.Struct, frozen=True, array_like=True):
    """What a head gives: float32 rows of `width` columns, one a sequence, a token or a marker token
    (`rows`), for `tasks`; and what a request may ask of them."""

    rows: str
    width: int
    tasks: tuple[str, ...]
    row_tokens: tuple[int, ...] = ()  # MARKER: the tokens that give the rows, a row each
    # TOKEN: the token whose trailing run in a sequence attends without being a key (a ColBERT query's
    # expansion, engine/batch.pack)
    query_only_token: int | None = None
    pools_spans: bool = False  # SEQUENCE: a request's spans pooled apart, a row each (late chunking)
    # TOKEN: a request's prefix is the query its sequences are scored against by MaxSim on the device (the
    # head's max_sim), each giving one row, its score in column 0
    scores_prefix: bool = False
    takes_first_rows: bool = False  # TOKEN: a request may take each sequence's first row only
    task_rows: dict[str, TaskRows] = {}  # of the tasks, those that read fewer rows or columns than given
    # SEQUENCE: a request's sequences may be images (a dual encoder's) or hold them (a vision-language
    # model's)
    takes_images: bool = False
    # (placeholder token, merge) where an image sits inside its sequence (a vision-language model's): a run
    # of that token, one for each merge x merge patches; None: an image is a sequence of its own
    image_run: tuple[int, int] | None = None
    # an image sequence's tokens each need its image's grid of patches (SigLIP2's NaFlex positions,
    # resampled to it: ImageBatch.grids); such batches of images run eagerly
    image_grids: bool = False

    @property
    def token_rows(self) -> bool:
        return self.rows == TOKEN


@dataclass(frozen=True, slots=True)
class RowRequest:
    """What one request asks back of its sequences, beside their token ids."""

    # tokens every sequence continues (a judge's template and query, run once a batch), or, where the head
    # scores_prefix, the query each sequence is scored against
    prefix: Sequence[int] | None = None
    # per sequence, the token offsets inside it where a new pooled span starts (None: one span)
    spans: Sequence[Sequence[int] | None] | None = None
    first_rows: bool = False  # a token head's first row of each sequence only
    columns: tuple[int, int] | None = None  # of each row, the columns [start, stop) only
    # per sequence, the pixels of the image it is or holds ([grid rows, grid columns, patch_dim] uint8; its
    # token ids hold a placeholder for each token the image takes), None for a text, or a tuple of such
    # grids in order for a vision-language model's sequence of several images; None: all texts
    images: Sequence[np.ndarray | tuple[np.ndarray, ...] | None] | None = None

    @classmethod
    def for_task(cls, output: HeadOutput, task: str) -> RowRequest:
        """What a request for `task` asks of a head with this output."""
        rows = output.task_rows.get(task)
        return cls() if rows is None else cls(first_rows=rows.first_rows, columns=rows.columns)

    def width(self, output: HeadOutput) -> int:
        """How wide each row it asks of a head of `output` comes back."""
        return output.width if self.columns is None else self.columns[1] - self.columns[0]

    def sliced(self, start: int, stop: int) -> RowRequest:
        """The request of sequences start..stop-1 of this one (a chunk of it)."""
        if self.spans is None and self.images is None:
            return self
        spans = None if self.spans is None else self.spans[start:stop]
        images = None if self.images is None else self.images[start:stop]
        return RowRequest(self.prefix, spans, self.first_rows, self.columns, images)


ALL_ROWS = RowRequest()
