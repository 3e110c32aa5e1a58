"""GraphCache: whole-model CUDA graphs per (token bucket, sequence slots, sequence-length bucket),
captured lazily into one shared memory pool; attention metadata lives in fixed-address buffers so a
graph replays with new lengths, and a backend that plans on the host (flashinfer) is handed each
replay's lengths first (`AttentionBackend.prepare`). A batch is padded with zero-length slots and dummy
sequences over the tail tokens, none longer than the length bucket. A batch whose sequences continue shared
prefixes has graphs of its own, keyed also by a bucket of its gathered keys (KeyLayout): the gather index and
the key cu_seqlens are then fixed-address buffers too."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import AttentionBackend, AttentionMetadata
from engine.attention.metadata import KeyLayout, gather_keys
from engine.batch import ImageBatch, PackedBatch
from engine.config import (
    LARGE_TOKEN_STEP,
    MIN_SEQLEN_BUCKET,
    SMALL_TOKEN_LIMIT,
    SMALL_TOKEN_STEP,
    EngineConfig,
)
from engine.progress import progress

logger = logging.getLogger(__name__)

# (token bucket, sequence slots, sequence-length bucket, key bucket: 0 where the batch has no key layout,
# patch size: a batch of images' pixels a token, 0 for texts)
GraphKey = tuple[int, int, int, int, int]


@dataclass(slots=True)
class _StaticInputs:
    """Device buffers a graph reads, filled by one host-to-device copy per step from a pinned
    staging buffer laid out the same way."""

    # int64: ids | types | positions | segments [num_tokens each] | lengths [num_slots] | cu_seqlens
    # [num_slots + 1], then with a key layout: key index [num_keys] | key cu_seqlens [num_slots + 1]
    ints: torch.Tensor
    # (a view of `ints`, the int32 buffer filled from it inside the graph): cu_seqlens, key cu_seqlens
    narrowed: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    batch: PackedBatch
    meta: AttentionMetadata

    @classmethod
    def allocate(
        cls, key: GraphKey, device: torch.device, pixels: torch.Tensor | None = None
    ) -> _StaticInputs:
        """`pixels`: an images key's [num_tokens, patch size] uint8 device buffer (a view of the cache's
        one buffer)."""
        num_tokens, num_slots, max_seqlen, num_keys, _ = key
        ints = torch.zeros(staging_size(key), dtype=torch.int64, device=device)
        cu_seqlens = torch.zeros(num_slots + 1, dtype=torch.int32, device=device)
        ids, types, positions, segments = ints[: 4 * num_tokens].view(4, num_tokens).unbind(0)
        lengths = ints[4 * num_tokens : 4 * num_tokens + num_slots]
        batch = PackedBatch(ids, types, positions, cu_seqlens, max_seqlen)
        if pixels is not None:
            batch.images = ImageBatch.only(pixels)
        narrowed = [(ints[_cu_seqlens_range(key)], cu_seqlens)]
        keys = None
        if num_keys:
            key_cu_seqlens = torch.zeros(num_slots + 1, dtype=torch.int32, device=device)
            narrowed.append((ints[_key_cu_seqlens_range(key)], key_cu_seqlens))
            index = ints[_key_index_range(key)]
            # max_seqlen: the length bucket bounds every sequence's keys, its prefix's included
            keys = KeyLayout(index, key_cu_seqlens, seqlens=(0,) * num_slots, max_seqlen=max_seqlen)
        # only graph-safe backends run here: they read cu_seqlens and max_seqlen (an upper bound)
        meta = AttentionMetadata(
            cu_seqlens=cu_seqlens,
            max_seqlen=max_seqlen,
            seqlens=(0,) * num_slots,
            runs=(),
            segment_ids=segments,
            lengths=lengths,
            keys=keys,
        )
        return cls(ints, tuple(narrowed), batch, meta)


def _cu_seqlens_range(key: GraphKey) -> slice:
    num_tokens, num_slots, *_ = key
    start = 4 * num_tokens + num_slots
    return slice(start, start + num_slots + 1)


def _key_index_range(key: GraphKey) -> slice:
    num_tokens, num_slots, _, num_keys, _ = key
    start = 4 * num_tokens + 2 * num_slots + 1
    return slice(start, start + num_keys)


def _key_cu_seqlens_range(key: GraphKey) -> slice:
    _, num_slots, _, num_keys, _ = key
    start = _key_index_range(key).stop
    return slice(start, start + num_slots + 1 if num_keys else start)


def host_cu_seqlens(ints: np.ndarray, key: GraphKey) -> torch.Tensor:
    """The int64 cu_seqlens of a staging layout, a view: valid until the staging buffer is written
    again (a backend that keeps it copies it)."""
    return torch.from_numpy(ints[_cu_seqlens_range(key)])


def host_key_cu_seqlens(ints: np.ndarray, key: GraphKey) -> torch.Tensor | None:
    """The int64 key cu_seqlens of a staging layout with a key layout (a view, as above); None without."""
    return torch.from_numpy(ints[_key_cu_seqlens_range(key)]) if key[3] else None


def staging_size(key: GraphKey) -> int:
    return _key_cu_seqlens_range(key).stop


def num_dummies(num_tokens: int, token_bucket: int, max_seqlen: int) -> int:
    """Dummy sequences over the padding tail, none longer than max_seqlen; none without padding."""
    return -(-(token_bucket - num_tokens) // max_seqlen)


def stage(batch: PackedBatch, key: GraphKey, out: np.ndarray | None = None) -> np.ndarray:
    """The staging layout of `batch` padded to `key` (into `out` when given): real sequences,
    zero-length slots, then the dummy sequences over the tail tokens (they soak up the padding and
    are never read back). With a key bucket, each slot's keys: its prefix's rows then its own (a dummy's
    own only), the index's tail pointing at row 0 and read by no slot."""
    num_tokens, num_slots, max_seqlen, num_keys, _ = key
    real_tokens, real_seqs = batch.num_tokens, batch.num_seqs
    dummies = num_dummies(real_tokens, num_tokens, max_seqlen)
    ints = np.empty(staging_size(key), dtype=np.int64) if out is None else out
    ids, types, positions, segments = ints[: 4 * num_tokens].reshape(4, num_tokens)
    slot_lengths = ints[4 * num_tokens : 4 * num_tokens + num_slots]
    cu_seqlens = ints[_cu_seqlens_range(key)]
    cu_seqlens[:] = real_tokens
    cu_seqlens[: real_seqs + 1] = batch.cu_seqlens.numpy()
    cu_seqlens[num_slots - dummies : num_slots] = np.arange(real_tokens, num_tokens, max_seqlen)
    cu_seqlens[-1] = num_tokens
    ids[:real_tokens] = batch.input_ids.numpy()
    types[:real_tokens] = batch.token_type_ids.numpy()
    positions[:real_tokens] = batch.positions.numpy()
    ids[real_tokens:] = types[real_tokens:] = positions[real_tokens:] = 0
    np.subtract(cu_seqlens[1:], cu_seqlens[:-1], out=slot_lengths)
    segments[:] = np.repeat(np.arange(num_slots), slot_lengths)
    if num_keys:
        prefix_of = np.full(num_slots, -1, dtype=np.int64)
        if batch.prefix_of is not None:
            prefix_of[:real_seqs] = batch.prefix_of.numpy()
        index, key_lengths = gather_keys(cu_seqlens[:-1], slot_lengths, prefix_of)
        key_index, key_cu_seqlens = ints[_key_index_range(key)], ints[_key_cu_seqlens_range(key)]
        key_index[: index.shape[0]] = index  # raises where the bucket is too small
        key_index[index.shape[0] :] = 0
        key_cu_seqlens[0] = 0
        np.cumsum(key_lengths, out=key_cu_seqlens[1:])
    # zero-length slots divide by one in mean pooling, never by zero
    np.maximum(slot_lengths, 1, out=slot_lengths)
    return ints


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: _StaticInputs
    output: torch.Tensor  # [num_slots, out_dim] float32, in the shared pool: read before the next replay
    staging: torch.Tensor  # pinned host twin of inputs.ints
    staged: torch.cuda.Event  # the last copy out of `staging`: wait for it before writing again


class GraphCache:
    def __init__(
        self,
        model: torch.nn.Module,
        attention: AttentionBackend,
        config: EngineConfig,
        device: torch.device,
        max_seqlen: int,
    ):
        """`attention`: the model's backend; `max_seqlen`: the model window, the longest real sequence a
        batch can hold."""
        self.model = model
        self.token_rows = model.output.token_rows  # a row a token, not a sequence
        self.attention = attention
        self.config = config
        self.device = device
        self.largest_seqlen_bucket = max(MIN_SEQLEN_BUCKET, 1 << (max_seqlen - 1).bit_length())
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[GraphKey, _Graph] = {}
        self.num_hits: Counter[GraphKey] = Counter()
        self.capture_seconds: dict[GraphKey, float] = {}
        self.memory_bytes = 0
        # images' pixels, a row a token, for every images key: one uint8 device buffer of the largest
        # bucket's rows (each key's graph reads its first rows) and its pinned host twin,
        # written after the last copy out of it (`pixels_staged`); allocated at the first images graph
        self.pixels: torch.Tensor | None = None
        self.pixel_staging: torch.Tensor | None = None
        self.pixels_staged: torch.cuda.Event | None = None

    def key(self, batch: PackedBatch) -> GraphKey | None:
        token_bucket = self.config.token_bucket(batch.num_tokens)
        if token_bucket is None:
            return None
        patch_size = 0
        if batch.images is not None:
            # a batch of fixed-size images alone runs its vision tower in a graph; texts and images
            # together, and images inside texts (a vision-language model's), eagerly
            images = batch.images
            if not isinstance(images, ImageBatch) or not images.only_images or batch.prefix_of is not None:
                return None
            if images.grids is not None:  # images of any size (SigLIP2's NaFlex): eagerly
                return None
            patch_size = batch.images.patch_size
        if batch.prefix_of is not None:
            return self.key_layout_key(batch, token_bucket)
        if batch.max_seqlen > self.largest_seqlen_bucket:
            # past the model window (a caller that sent ids the routes would have cut): no graph's
            # length bucket, nor its dummies' slots, holds it
            return None
        if self.config.cuda_graphs == "eager-warmup" and not patch_size:
            # pre-warmed graphs have the most slots and the longest sequences: every batch finds one
            return self.warm_key(token_bucket)
        seqlen = self.config.seqlen_bucket(batch.max_seqlen, self.largest_seqlen_bucket)
        num_slots = batch.num_seqs + num_dummies(batch.num_tokens, token_bucket, seqlen)
        return token_bucket, self.config.sequence_bucket(num_slots, token_bucket), seqlen, 0, patch_size

    def key_layout_key(self, batch: PackedBatch, token_bucket: int) -> GraphKey | None:
        """The key of a batch whose sequences continue shared prefixes: its length bucket bounds each
        sequence's keys (prefix and own tokens), its key bucket holds them all and the dummies' own; None
        (eager) where a sequence's keys outrun the longest length bucket. Captured lazily, in either mode."""
        lengths = np.diff(batch.cu_seqlens.numpy())
        prefix_of = batch.prefix_of.numpy()
        prefix_lengths = np.where(prefix_of >= 0, lengths[np.maximum(prefix_of, 0)], 0)
        longest = int((lengths + prefix_lengths).max())
        if longest > self.largest_seqlen_bucket:
            return None
        seqlen = self.config.seqlen_bucket(longest, self.largest_seqlen_bucket)
        num_slots = batch.num_seqs + num_dummies(batch.num_tokens, token_bucket, seqlen)
        num_keys = self.config.key_bucket(token_bucket + int(prefix_lengths.sum()))
        return token_bucket, self.config.sequence_bucket(num_slots, token_bucket), seqlen, num_keys, 0

    def warm_key(self, token_bucket: int) -> GraphKey:
        seqlen = self.largest_seqlen_bucket
        padding = SMALL_TOKEN_STEP if token_bucket <= SMALL_TOKEN_LIMIT else LARGE_TOKEN_STEP
        num_slots = self.config.max_batch_seqs + num_dummies(token_bucket - padding, token_bucket, seqlen)
        return token_bucket, self.config.sequence_bucket(num_slots, token_bucket), seqlen, 0, 0

    def run(self, batch: PackedBatch) -> torch.Tensor | None:
        """[num_seqs, out_dim] rows (a token head's: [num_tokens, out_dim]) on the device from a graph, or
        None: run this batch eagerly (also one with query-only tokens, whose key layout no graph stages,
        with pooled spans, with rows at chosen tokens, or with texts and images together)."""
        unstaged = (batch.num_query_only, batch.pool_cu_seqlens, batch.row_index)
        eager = any(layout is not None for layout in unstaged)
        key = None if eager else self.key(batch)
        if key is None:
            return None
        self.num_hits[key] += 1
        graph = self.graphs.get(key)
        if graph is None:
            # lazy: a bucket's first hit runs eagerly, its second captures
            if self.num_hits[key] < 2:
                return None
            graph = self.capture(key)
        # long done in practice: the copies (inputs and any plan) ran before the last replay
        graph.staged.synchronize()
        staged = stage(batch, key, out=graph.staging.numpy())
        self.attention.prepare(
            graph.inputs.meta, host_cu_seqlens(staged, key), host_key_cu_seqlens(staged, key)
        )
        graph.inputs.ints.copy_(graph.staging, non_blocking=True)
        if key[4]:
            self.stage_pixels(batch, graph.inputs.batch.images.pixels)
        graph.staged.record()
        graph.graph.replay()
        return graph.output[: batch.num_tokens if self.token_rows else batch.num_seqs]

    def stage_pixels(self, batch: PackedBatch, pixels: torch.Tensor) -> None:
        """A batch of images' pixels into the graph's rows of the shared buffer (the host writes each image
        once), zeros past them."""
        self.pixels_staged.synchronize()  # long done: it ran before the last replay
        staging = self.pixel_staging[: pixels.shape[0]]
        batch.images.write(staging)  # the real tokens' rows, then zeros over the padding
        pixels.copy_(staging, non_blocking=True)
        self.pixels_staged.record()

    def pixel_rows(self, key: GraphKey) -> torch.Tensor | None:
        """An images key's rows of the shared pixel buffer (allocated at the first); None for texts."""
        num_tokens, patch_size = key[0], key[4]
        if not patch_size:
            return None
        if self.pixels is None:  # a model's images have one patch size
            rows = max(self.config.token_buckets())
            # 8-bit, as the host sends them: the patch embedding rescales and normalizes them
            self.pixels = torch.zeros(rows, patch_size, dtype=torch.uint8, device=self.device)
            self.pixel_staging = torch.zeros(rows, patch_size, dtype=torch.uint8, pin_memory=True)
            self.pixels_staged = torch.cuda.Event()
            self.pixels_staged.record()
        return self.pixels[:num_tokens]

    def capture(self, key: GraphKey) -> _Graph:
        started = time.perf_counter()
        # capture itself empties the allocator's cache: empty it first so the growth is the pool's
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved(self.device)
        inputs = _StaticInputs.allocate(key, self.device, self.pixel_rows(key))
        # a valid batch in the buffers while capturing: one sequence as long as the key allows (with
        # its dummies it covers the whole bucket, as a host plan's first layout must)
        placeholder = stage(_placeholder_batch(key), key)
        inputs.ints.copy_(torch.from_numpy(placeholder))
        self.attention.prepare(
            inputs.meta, host_cu_seqlens(placeholder, key), host_key_cu_seqlens(placeholder, key)
        )

        def forward() -> torch.Tensor:
            for source, narrow in inputs.narrowed:
                narrow.copy_(source)
            return self.model(inputs.batch, inputs.meta).float()  # the rows the host reads

        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            forward()  # warm-up run outside the graph
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = forward()
        staging = torch.empty(staging_size(key), dtype=torch.int64, pin_memory=True)
        staged = torch.cuda.Event()
        staged.record()
        captured = _Graph(graph, inputs, output, staging, staged)
        self.graphs[key] = captured
        self.capture_seconds[key] = time.perf_counter() - started
        self.memory_bytes += torch.cuda.memory_reserved(self.device) - reserved
        logger.debug("captured graph %s in %.1f ms", key, 1000 * self.capture_seconds[key])
        return captured

    def warm_up(self) -> None:
        """eager-warmup: capture every token bucket with its largest slot count, largest first."""
        for token_bucket in progress(self.config.token_buckets(), "capturing CUDA graphs", logger):
            key = self.warm_key(token_bucket)
            if key not in self.graphs:
                self.capture(key)
        logger.info("captured %d CUDA graphs, %.0f MiB", len(self.graphs), self.memory_bytes / 2**20)


def _placeholder_batch(key: GraphKey) -> PackedBatch:
    """One sequence of min(length bucket, tokens) zeros: with its dummies it takes ceil(tokens /
    length bucket) slots, and so fits any key a real batch produced (k sequences of real tokens T,
    none longer than the length bucket L, and their dummies take k + ceil((tokens - T) / L) slots,
    at least that many)."""
    num_tokens, _, max_seqlen, *_ = key
    length = min(max_seqlen, num_tokens)
    zeros = torch.zeros(length, dtype=torch.int64)
    return PackedBatch(zeros, zeros, zeros, torch.tensor([0, length], dtype=torch.int32), length)
