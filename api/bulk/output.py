"""A bulk job's output: a folder of Parquet shards (part-00000.parquet, ...: the ids and a float32 vector
per row, a SPLADE model's sparse one: its token ids and weights, or a ColBERT model's token vectors) and
_manifest.json, which names the job and every finished shard. A shard is written under a hidden name and
moved into place, then recorded; a job killed at any point leaves finished shards and at most one
unrecorded one, which a rerun writes again. Readers (pyarrow.dataset, pandas, Spark) skip the underscore
and dot files, so the folder reads as one table."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from api.bulk.errors import JobError
from api.bulk.source import filesystem

MANIFEST = "_manifest.json"
EMBEDDING_COLUMN = "embedding"


def shard_file(index: int) -> str:
    return f"part-{index:05d}.parquet"


@dataclass(slots=True)
class Output:
    uri: str
    job: dict[str, Any]  # what a shard's rows depend on; a rerun with another job is refused
    shards: dict[int, dict[str, Any]] = field(default_factory=dict)  # finished: index -> rows, ids
    complete: bool = False
    # shards are written by several threads at once; one manifest update at a time
    _manifest_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def open(self) -> None:
        """Creates the folder, or takes up the finished shards of the same job written there before."""
        fs, path = filesystem(self.uri)
        fs.create_dir(path, recursive=True)
        try:
            with fs.open_input_stream(f"{path}/{MANIFEST}") as stream:
                manifest = json.loads(stream.read())
        except FileNotFoundError:
            self._write_manifest()
            return
        if manifest.get("job") != self.job:
            raise JobError(
                f"{self.uri} holds the shards of another job ({manifest.get('job')}): "
                "give another --output, or delete it"
            )
        self.shards = {int(index): entry for index, entry in manifest.get("shards", {}).items()}
        self.complete = bool(manifest.get("complete"))

    @property
    def finished_rows(self) -> int:
        return sum(entry["rows"] for entry in self.shards.values())

    def check_finished(self, index: int, ids: Sequence[Any]) -> None:
        """A finished shard's ids must be the input's still: otherwise the input changed under the job."""
        entry = self.shards[index]
        if entry["rows"] != len(ids) or entry["first_id"] != ids[0] or entry["last_id"] != ids[-1]:
            raise JobError(
                f"the input's shard {index} is not the one {self.uri} holds ({entry}): the input changed "
                "since; give another --output, or delete it"
            )

    def open_shard(self, index: int, id_column: str) -> ShardWriter:
        return ShardWriter(self, index, id_column)

    def record(self, index: int, rows: int, first_id: Any, last_id: Any) -> None:
        """Shard `index` is in place: the manifest names it (several shards may finish at once)."""
        with self._manifest_lock:
            self.shards[index] = {"rows": rows, "first_id": first_id, "last_id": last_id}
            self._write_manifest()

    def finish(self) -> None:
        """Marks the job done; a shard the input no longer has (a shorter input) would be an error."""
        self.complete = True
        self._write_manifest()

    def _write_manifest(self) -> None:
        fs, path = filesystem(self.uri)
        manifest = {
            "job": self.job,
            "shards": {str(index): self.shards[index] for index in sorted(self.shards)},
            "complete": self.complete,
        }
        hidden = f"{path}/.{MANIFEST}.partial"
        with fs.open_output_stream(hidden) as stream:
            stream.write(json.dumps(manifest, indent=1).encode())
        fs.move(hidden, f"{path}/{MANIFEST}")


class ShardWriter:
    """One shard's Parquet file, written a row group at a time while the shard is still embedding (the
    job's end then waits for one row group, not a whole shard, and holds no shard's vectors), under a
    hidden name until `close` moves it into place and records it."""

    def __init__(self, output: Output, index: int, id_column: str):
        self.output = output
        self.index = index
        self.id_column = id_column
        self.fs, folder = filesystem(output.uri)
        self.hidden = f"{folder}/.{shard_file(index)}.partial"
        self.path = f"{folder}/{shard_file(index)}"
        self._writer: pq.ParquetWriter | None = None
        self.rows = 0
        self.first_id: Any = None
        self.last_id: Any = None

    def write(self, ids: Sequence[Any], parts: Sequence[pa.Array]) -> None:
        """The next rows: their ids, and their vectors in one or more arrays (one Arrow chunk each, no
        copy: joining them would hold the GIL that the engine's thread needs)."""
        vectors = pa.chunked_array(parts)
        if self._writer is None:
            table = pa.table({self.id_column: pa.array(ids), EMBEDDING_COLUMN: vectors})
            # vectors neither repeat nor compress: no dictionary, no compression (1.6x faster to write)
            compression = {self.id_column: "snappy", EMBEDDING_COLUMN: "none"}
            self._writer = pq.ParquetWriter(
                self.hidden, table.schema, filesystem=self.fs, use_dictionary=[self.id_column],
                compression=compression,
            )  # fmt: skip
            self.first_id = ids[0]
        else:
            id_type = self._writer.schema.field(self.id_column).type
            try:
                id_array = pa.array(ids, type=id_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
                raise JobError(f"the ids of shard {self.index} are not all {id_type}: {error}") from error
            table = pa.table({self.id_column: id_array, EMBEDDING_COLUMN: vectors})
        self._writer.write_table(table)
        self.rows += len(ids)
        self.last_id = ids[-1]

    def close(self) -> None:
        """The shard is whole: in place, and in the manifest."""
        assert self._writer is not None, "a shard has at least one row"
        self._writer.close()
        self._writer = None
        self.fs.move(self.hidden, self.path)
        self.output.record(self.index, self.rows, self.first_id, self.last_id)

    def discard(self) -> None:
        """Stops without recording (once closed, nothing): the partial file stays hidden, and a rerun
        writes the shard again."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def fixed_size_vectors(vectors: np.ndarray) -> pa.FixedSizeListArray:
    rows = np.ascontiguousarray(vectors, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), rows.shape[1])


def token_vectors(rows: np.ndarray, lengths: Sequence[int], kept: np.ndarray) -> pa.ListArray:
    """[tokens, dim] rows of sequences of `lengths` -> each sequence's `kept` rows (a bool a token), a
    list of vectors a row (a ColBERT document's: those of its tokens but its punctuation)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    counts = np.add.reduceat(kept.astype(np.int64), starts)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]), pa.int32())
    return pa.ListArray.from_arrays(offsets, fixed_size_vectors(rows[kept]))


def sparse_vectors(weights: np.ndarray) -> pa.StructArray:
    """[rows, vocabulary] weights -> each row's non-zero ones, {indices: token ids, values: weights} in
    token id order, as sparse vector stores take them (Qdrant's SparseVector, for one)."""
    rows, token_ids = np.nonzero(weights)  # row by row, each row's ids in order
    counts = np.bincount(rows, minlength=len(weights))
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]), pa.int32())
    indices = pa.ListArray.from_arrays(offsets, pa.array(token_ids.astype(np.int32)))
    values = pa.ListArray.from_arrays(offsets, pa.array(weights[rows, token_ids].astype(np.float32)))
    return pa.StructArray.from_arrays([indices, values], names=["indices", "values"])


def read_output(uri: str) -> pa.Table:
    """Every shard in order, as one table (what a user of the output reads)."""
    fs, path = filesystem(uri)
    files = sorted(
        info.path
        for info in fs.get_file_info(pafs.FileSelector(path))
        if info.base_name.startswith("part-") and info.base_name.endswith(".parquet")
    )
    return pa.concat_tables([pq.read_table(file, filesystem=fs) for file in files])
