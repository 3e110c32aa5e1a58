"""PackedBatch: sequences laid end to end, described by cu_seqlens; no padding."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.inline_images import ImageEntry, InlineImages, check_image_runs, images_of, inline_images
from engine.outputs import MARKER, TOKEN, HeadOutput, RowRequest


@dataclass(slots=True)
class ImageBatch:
    """A batch's images (a dual encoder's): the sequences that are images, their pixels, and where each
    tower's tokens are. An image sequence's tokens are the model's own leading token (a class token, at
    position 0) where it has one, then one a patch. On the host each image's patches stay the array they
    came as, written once into the buffer that goes to the device (`write`); on the device `pixels` holds
    them a row a token."""

    # [num_image_tokens, patch_dim] on the device: each image token's patch pixels (uint8, as the host
    # sends them: the model rescales and normalizes), zeros at a class token; None on the host, where
    # `patches` and `rows` say what to write
    pixels: torch.Tensor | None
    image_tokens: torch.Tensor  # [num_image_tokens] int64: the batch's tokens that are images'
    image_seqs: torch.Tensor  # [num_images] int64: the batch's sequences that are images
    image_cu_seqlens: torch.Tensor  # host [num_images + 1] int32, of the images' tokens alone
    text_tokens: torch.Tensor  # likewise of the texts (empty where none)
    text_seqs: torch.Tensor
    text_cu_seqlens: torch.Tensor  # host
    patches: Sequence[np.ndarray] = ()  # host: each image's [num_patches, patch_dim] uint8 (its grid, flat)
    rows: Sequence[int] = ()  # host: the row (among the images' tokens) of each image's first patch
    # [num_image_tokens, 2] int64: each image token's image's rows and columns of patches, where the head
    # reads them (HeadOutput.image_grids); None: it does not
    grids: torch.Tensor | None = None

    @classmethod
    def only(cls, pixels: torch.Tensor) -> ImageBatch:
        """A batch of images alone, of these pixels (a CUDA graph's static inputs): every token an image's."""
        empty = pixels.new_empty(0, dtype=torch.int64)
        host = torch.zeros(1, dtype=torch.int32)
        return cls(pixels, empty, empty, host, empty, empty, host)

    @property
    def only_images(self) -> bool:
        """Every sequence of the batch is an image: its tokens are the images' tokens, in order."""
        return self.text_seqs.numel() == 0

    @property
    def num_rows(self) -> int:
        return int(self.image_cu_seqlens[-1])

    @property
    def patch_size(self) -> int:
        return self.patches[0].shape[1]

    def write(self, out: torch.Tensor) -> None:
        """The pixels a row a token into `out` (host, [num_rows, patch_dim] uint8), zeros at the class tokens;
        one pass over each image."""
        start = 0
        for row, image in zip(self.rows, self.patches):
            out[start:row].zero_()
            out[row : row + len(image)].copy_(torch.from_numpy(image))
            start = row + len(image)
        out[start:].zero_()

    def to(self, device: torch.device | str) -> ImageBatch:
        cuda = torch.device(device).type == "cuda"

        def moved(tensor: torch.Tensor) -> torch.Tensor:
            return (tensor.pin_memory() if cuda else tensor).to(device, non_blocking=True)

        pixels = torch.empty(self.num_rows, self.patch_size, dtype=torch.uint8, pin_memory=cuda)
        self.write(pixels)
        return ImageBatch(
            pixels.to(device, non_blocking=True), moved(self.image_tokens), moved(self.image_seqs),
            self.image_cu_seqlens, moved(self.text_tokens), moved(self.text_seqs), self.text_cu_seqlens,
            grids=None if self.grids is None else moved(self.grids),
        )  # fmt: skip


@dataclass(slots=True)
class PackedBatch:
    input_ids: torch.Tensor  # [num_tokens] int64
    token_type_ids: torch.Tensor  # [num_tokens] int64 (zeros when the model has no segments)
    positions: torch.Tensor  # [num_tokens] int64, restarting at 0 for every sequence
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int32, cumulative sequence lengths
    max_seqlen: int
    # host [num_seqs] int64: the sequence of this batch whose tokens each sequence continues (a shared
    # prefix, which precedes it and attends to itself only), -1 for none; None: no sequence has one
    prefix_of: torch.Tensor | None = None
    # host [num_seqs] int64: each sequence's trailing tokens that attend but are no key of any token (a
    # ColBERT query's expansion tokens); None: every token is a key
    num_query_only: torch.Tensor | None = None
    # host [num_pools + 1] int32: where each pooled span starts, a partition of the tokens finer than
    # cu_seqlens (late chunking: a sequence's chunks pooled apart); None: a span a sequence
    pool_cu_seqlens: torch.Tensor | None = None
    # [num_rows] int64: the tokens that give the head's rows, in order (a listwise ranker's markers: a row
    # each of its documents' and its query's); None: the head's own rule (a row a sequence or a token)
    row_index: torch.Tensor | None = None
    # host [num_seqs] int64: the sequence of this batch each one is scored against (a ColBERT query, by
    # MaxSim), -1 for none; None: no sequence is (pack's `prefix_of` with `prefixes_scored`)
    scored_against: torch.Tensor | None = None
    # host [num_rows] int64: the token rows a token head gives, in order, where some sequence gives its
    # first row only (pack's `first_rows`); None: every token's. Taken after the forward (or the graph)
    kept_rows: torch.Tensor | None = None
    # the sequences that are images (a dual encoder's), or the images inside them (a vision-language
    # model's); None: all texts
    images: ImageBatch | InlineImages | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.cu_seqlens.shape[0] - 1

    def towers(self) -> tuple[PackedBatch, PackedBatch] | None:
        """A dual encoder's batch of texts and images (on the host) as a batch of its texts and one of its
        images, each of a kind a CUDA graph runs; None where it is of one kind, or asks for more than a row
        a sequence."""
        images = self.images
        if not isinstance(images, ImageBatch) or images.only_images:
            return None
        layouts = (
            self.prefix_of, self.num_query_only, self.pool_cu_seqlens, self.row_index, self.scored_against,
            self.kept_rows,
        )  # fmt: skip
        if any(layout is not None for layout in layouts):
            return None

        def part(tokens: torch.Tensor, cu_seqlens: torch.Tensor, own: ImageBatch | None) -> PackedBatch:
            lengths = torch.diff(cu_seqlens)
            return PackedBatch(
                self.input_ids[tokens], self.token_type_ids[tokens], self.positions[tokens], cu_seqlens,
                int(lengths.max()), images=own,
            )  # fmt: skip

        empty = images.text_tokens.new_empty(0)
        every_token, every_seq = torch.arange(images.num_rows), torch.arange(images.image_seqs.numel())
        only = ImageBatch(
            None, every_token, every_seq, images.image_cu_seqlens, empty, empty, images.text_cu_seqlens[:1],
            images.patches, images.rows, images.grids,
        )  # fmt: skip
        return (
            part(images.text_tokens, images.text_cu_seqlens, None),
            part(images.image_tokens, images.image_cu_seqlens, only),
        )

    def pin_memory(self) -> PackedBatch:
        return PackedBatch(
            input_ids=self.input_ids.pin_memory(),
            token_type_ids=self.token_type_ids.pin_memory(),
            positions=self.positions.pin_memory(),
            cu_seqlens=self.cu_seqlens.pin_memory(),
            max_seqlen=self.max_seqlen,
            prefix_of=self.prefix_of,
            num_query_only=self.num_query_only,
            pool_cu_seqlens=self.pool_cu_seqlens,
            row_index=None if self.row_index is None else self.row_index.pin_memory(),
            scored_against=self.scored_against,
            kept_rows=None if self.kept_rows is None else self.kept_rows.pin_memory(),
            images=self.images,  # pinned as it moves
        )

    def to(self, device: torch.device | str) -> PackedBatch:
        return PackedBatch(
            input_ids=self.input_ids.to(device, non_blocking=True),
            token_type_ids=self.token_type_ids.to(device, non_blocking=True),
            positions=self.positions.to(device, non_blocking=True),
            cu_seqlens=self.cu_seqlens.to(device, non_blocking=True),
            max_seqlen=self.max_seqlen,
            prefix_of=self.prefix_of,  # read on the host, by the attention metadata
            num_query_only=self.num_query_only,  # likewise
            pool_cu_seqlens=self.pool_cu_seqlens,  # likewise
            row_index=None if self.row_index is None else self.row_index.to(device, non_blocking=True),
            scored_against=self.scored_against,  # read on the host
            kept_rows=self.kept_rows,  # the runner's, after the forward
            images=None if self.images is None else self.images.to(device),
        )


def pack(
    token_ids: Sequence[Sequence[int]],
    token_type_ids: Sequence[Sequence[int] | None] | None = None,
    prefix_of: Sequence[int] | None = None,
    spans: Sequence[Sequence[int] | None] | None = None,
    first_rows: Sequence[bool] | None = None,
    output: HeadOutput | None = None,
    images: Sequence[ImageEntry] | None = None,
) -> PackedBatch:
    """Lay sequences end to end on the host, for a head that gives `output` (None: a row a sequence);
    `token_type_ids[i]` None means all zeros. `prefix_of[i]` (-1: none) is an earlier sequence that
    sequence i continues: its positions go on from that prefix's length, and its keys are the prefix's,
    then its own (AttentionMetadata.build); where the head scores_prefix, it is instead the query that
    sequence i is scored against (`scored_against`), and each runs as a sequence of its own. A sequence's
    trailing run of the head's query_only_token attends to the tokens before it but is no key (a ColBERT
    query's expansion: a tokenized text ends with a special token, never with it). `spans[i]` (None: none)
    are the token offsets inside sequence i where a new pooled span starts (late chunking). A MARKER
    head's row_tokens give the rows (`row_index`). With `first_rows`, sequence i of a token head gives its
    first row only where first_rows[i] (`kept_rows`). `images[i]` (None: a text) makes sequence i an image,
    of those patches' pixels (ImageBatch), or for a head with an image_run the images it holds, in order
    (InlineImages)."""
    query_only_token = None if output is None else output.query_only_token
    row_tokens = output.row_tokens if output is not None and output.rows == MARKER else None
    prefixes_scored = output is not None and output.scores_prefix
    # Python ints for the per-sequence numbers: a batch of one short text (the latency case) then
    # costs a few numpy calls, not a dozen
    lengths = [len(ids) for ids in token_ids]
    if not lengths or min(lengths) == 0:
        raise ValueError("a packed batch needs at least one sequence and no empty sequence")
    num_tokens = sum(lengths)
    cu_seqlens = np.fromiter(itertools.accumulate(lengths, initial=0), dtype=np.int32, count=len(lengths) + 1)
    if isinstance(token_ids[0], np.ndarray):  # views of one tokenized chunk (bulk jobs): no Python ints
        flat_ids = np.concatenate(token_ids, dtype=np.int64)
    else:
        flat_ids = np.fromiter(itertools.chain.from_iterable(token_ids), dtype=np.int64, count=num_tokens)
    positions = np.arange(num_tokens, dtype=np.int64)
    if len(lengths) > 1:
        positions -= np.repeat(cu_seqlens[:-1].astype(np.int64), lengths)
    kept_rows = None
    if first_rows is not None and any(first_rows):
        dropped = np.repeat(np.asarray(first_rows, dtype=bool), lengths) & (positions > 0)
        kept_rows = torch.from_numpy(np.flatnonzero(~dropped))
    prefixes = None if prefix_of is None else np.asarray(prefix_of, dtype=np.int64)
    if prefixes is not None:
        check_prefixes(prefixes, len(lengths))
    if prefixes is not None and (prefixes < 0).all():
        prefixes = None
    scored_against = None
    if prefixes is not None and prefixes_scored:
        scored_against, prefixes = torch.from_numpy(prefixes), None
    if prefixes is not None:
        offsets = np.where(prefixes >= 0, np.asarray(lengths)[np.maximum(prefixes, 0)], 0)
        positions += np.repeat(offsets, lengths)
    flat_types = np.zeros(num_tokens, dtype=np.int64)
    if token_type_ids is not None:
        for start, types in zip(cu_seqlens[:-1].tolist(), token_type_ids):
            if types is not None:
                flat_types[start : start + len(types)] = types
    tensors = (torch.from_numpy(array) for array in (flat_ids, flat_types, positions, cu_seqlens))
    prefix_tensor = None if prefixes is None else torch.from_numpy(prefixes)
    query_only = None if query_only_token is None else trailing_counts(token_ids, query_only_token)
    if query_only is not None and prefixes is not None:
        raise ValueError("a batch's sequences either continue prefixes or end in query-only tokens")
    pool_cu_seqlens = None if spans is None else span_starts(cu_seqlens, spans)
    return PackedBatch(
        *tensors,
        max_seqlen=max(lengths),
        prefix_of=prefix_tensor,
        num_query_only=query_only,
        pool_cu_seqlens=pool_cu_seqlens,
        row_index=None if row_tokens is None else row_positions(flat_ids, row_tokens),
        scored_against=scored_against,
        kept_rows=kept_rows,
        images=None if images is None else batch_images(cu_seqlens, flat_ids, positions, images, output),
    )


def batch_images(
    cu_seqlens: np.ndarray,
    flat_ids: np.ndarray,
    positions: np.ndarray,
    images: Sequence[ImageEntry],
    output: HeadOutput | None,
) -> ImageBatch | InlineImages | None:
    """pack's images: sequences of their own (ImageBatch), or inside texts where the head says so."""
    if output is not None and output.image_run is not None:
        return inline_images(cu_seqlens, flat_ids, images, *output.image_run, places=positions)
    return image_batch(cu_seqlens, images, output is not None and output.image_grids)


def image_batch(
    cu_seqlens: np.ndarray, images: Sequence[np.ndarray | None], with_grids: bool = False
) -> ImageBatch | None:
    """Where the images of a batch (pack's `images`) and its texts are, and `with_grids` each image token's
    grid; None where it has no image."""
    if len(images) != len(cu_seqlens) - 1:
        raise ValueError(f"{len(images)} image entries for {len(cu_seqlens) - 1} sequences")
    is_image = np.fromiter((image is not None for image in images), dtype=bool, count=len(images))
    if not is_image.any():
        return None
    lengths = np.diff(cu_seqlens).astype(np.int64)

    def tokens_of(seqs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        # the flat token index of those sequences, and their own cu_seqlens
        own = np.concatenate([[0], np.cumsum(lengths[seqs])]).astype(np.int32)
        index = np.arange(int(own[-1]), dtype=np.int64) + np.repeat(
            cu_seqlens[seqs] - own[:-1], lengths[seqs]
        )
        return torch.from_numpy(index), torch.from_numpy(own)

    image_seqs, text_seqs = np.flatnonzero(is_image), np.flatnonzero(~is_image)
    image_tokens, image_cu = tokens_of(image_seqs)
    text_tokens, text_cu = tokens_of(text_seqs)
    patches = [images[i].reshape(-1, images[i].shape[-1]) for i in image_seqs]
    counts = np.fromiter((len(pixels) for pixels in patches), dtype=np.int64, count=len(patches))
    leading = lengths[image_seqs] - counts  # the model's own token before an image's patches
    if not ((leading == 0) | (leading == 1)).all() or (counts == 0).any():
        raise ValueError("an image sequence has at least one patch, a token for each, and at most one more")
    if len({image.shape[1] for image in patches}) != 1:
        raise ValueError("a batch's images have one patch size")
    grids = None
    if with_grids:
        shapes = [images[i].shape[:2] for i in image_seqs]
        grids = torch.from_numpy(np.repeat(np.asarray(shapes, dtype=np.int64), lengths[image_seqs], axis=0))
    return ImageBatch(
        None,
        image_tokens,
        torch.from_numpy(image_seqs),
        image_cu,
        text_tokens,
        torch.from_numpy(text_seqs),
        text_cu,
        patches,
        (image_cu[:-1].numpy() + leading).tolist(),
        grids,
    )


def row_positions(flat_ids: np.ndarray, row_tokens: Sequence[int]) -> torch.Tensor:
    return torch.from_numpy(np.flatnonzero(np.isin(flat_ids, row_tokens)))


def rows_per_sequence(
    output: HeadOutput, token_ids: Sequence[Sequence[int]], rows: RowRequest
) -> list[int] | None:
    """How many rows each sequence of a request gives a head of `output`, asked for `rows`; None: one each
    (a pooled head's; a token head's with a prefix it is scored against, or its first rows only)."""
    if rows.spans is not None:
        return list(map(num_spans, rows.spans))
    if output.rows == MARKER:
        return [count_row_tokens(ids, output.row_tokens) for ids in token_ids]
    if output.rows == TOKEN and rows.prefix is None and not rows.first_rows:
        return list(map(len, token_ids))
    return None


def count_row_tokens(ids: Sequence[int], row_tokens: Sequence[int]) -> int:
    """How many rows a sequence gives where the tokens of `row_tokens` give them (pack's `row_tokens`)."""
    if isinstance(ids, list):
        return sum(map(ids.count, row_tokens))
    return int(np.isin(np.asarray(ids), row_tokens).sum())


def span_starts(cu_seqlens: np.ndarray, spans: Sequence[Sequence[int] | None]) -> torch.Tensor | None:
    """[num_pools + 1] int32: each sequence's start, then its span boundaries; the end. None: no spans."""
    if all(boundaries is None for boundaries in spans):
        return None
    starts: list[int] = []
    for start, boundaries in zip(cu_seqlens[:-1].tolist(), spans):
        starts.append(start)
        starts += [start + offset for offset in boundaries or ()]
    starts.append(int(cu_seqlens[-1]))
    return torch.tensor(starts, dtype=torch.int32)


def check_spans(spans: Sequence[Sequence[int] | None], lengths: Sequence[int]) -> None:
    """Span boundaries (pack's `spans`) increase strictly inside their sequence; one entry a sequence."""
    if len(spans) != len(lengths):
        raise ValueError(f"{len(spans)} span lists for {len(lengths)} sequences")
    for boundaries, length in zip(spans, lengths):
        if boundaries is not None and not all(a < b for a, b in zip([0, *boundaries], [*boundaries, length])):
            raise ValueError("span boundaries must increase inside their sequence")


def check_images(output: HeadOutput, rows: RowRequest, token_ids: Sequence[Sequence[int]]) -> None:
    """Images go to a head that takes them, one entry a sequence, each a grid of uint8 patches: a sequence
    of its own with a token for each patch (one image), or inside its sequence at a run of placeholders
    (HeadOutput.image_run) as long as its merged patches, one run for each of its images."""
    if not output.takes_images:
        raise ValueError("this model takes no images")
    # a prefix its sequences continue holds no image; one they are scored against (a query) may come
    if (rows.prefix is not None and not output.scores_prefix) or rows.spans is not None:
        raise ValueError("images come without a shared prefix or spans")
    if len(rows.images) != len(token_ids):
        raise ValueError(f"{len(rows.images)} image entries for {len(token_ids)} sequences")
    for entry, ids in zip(rows.images, token_ids):
        images = images_of(entry)
        for image in images:
            if image.ndim != 3 or image.dtype != np.uint8 or image.shape[0] * image.shape[1] == 0:
                raise ValueError("an image is a grid of uint8 patches [rows, columns, patch size]")
        if output.image_run is not None:
            if images:
                check_image_runs(ids, images, *output.image_run)
        elif len(images) > 1:
            raise ValueError("a sequence of this model is one image")
        elif images and images[0].shape[0] * images[0].shape[1] > len(ids):
            raise ValueError("an image's sequence has a token for each of its patches")


def num_spans(boundaries: Sequence[int] | None) -> int:
    return 1 if boundaries is None else len(boundaries) + 1


def trailing_counts(token_ids: Sequence[Sequence[int]], token: int) -> torch.Tensor | None:
    """[num_seqs] int64: how many of each sequence's last tokens are `token`; None where none is."""
    counts = []
    for ids in token_ids:
        count = 0
        while count < len(ids) and ids[len(ids) - 1 - count] == token:
            count += 1
        counts.append(count)
    if not any(counts):
        return None
    if any(count == len(ids) for count, ids in zip(counts, token_ids)):
        raise ValueError("a sequence of query-only tokens alone has no key to attend to")
    return torch.tensor(counts, dtype=torch.int64)


def check_prefixes(prefixes: np.ndarray, num_seqs: int) -> None:
    """A prefix comes before the sequences that continue it and continues none itself."""
    if prefixes.shape != (num_seqs,):
        raise ValueError(f"prefix_of has {prefixes.shape[0]} entries for {num_seqs} sequences")
    has = prefixes >= 0
    if (prefixes[has] >= np.arange(num_seqs)[has]).any():
        raise ValueError("a sequence's prefix must come before it in the batch")
    if has.any() and (prefixes[prefixes[has]] >= 0).any():
        raise ValueError("a prefix cannot itself continue a prefix")


def sequence_rows(output: HeadOutput, sequence) -> int:
    """How many rows a ScheduledSequence of a batch gives a head of `output`, as pack laid it out: a span
    each (one without spans); a marker each; or, a token head's, a row a token, one (its score) where it
    is scored against its prefix or gave its first row only, none for that prefix (the query)."""
    if output.rows == MARKER:
        return count_row_tokens(sequence.token_ids, output.row_tokens)
    if output.rows == TOKEN:
        if sequence.is_prefix:
            return 0
        return 1 if sequence.prefix_at >= 0 or sequence.first_row else len(sequence.token_ids)
    return num_spans(sequence.spans)
