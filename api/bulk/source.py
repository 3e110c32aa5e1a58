"""A bulk job's input: JSONL, CSV or Parquet, local or on any filesystem pyarrow understands (s3://...),
or JSONL and CSV from a stream (stdin as `-`, a pipe), read in record batches so that a file larger than
memory streams, and cut into shards of a fixed number of rows, so that shard k is the same rows on every
run."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.fs as pafs

from api.bulk.errors import JobError

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}
COMPRESSIONS = (".gz", ".bz2", ".zst", ".lz4")  # pyarrow decompresses a file of these as it opens it
READ_BLOCK_BYTES = 16 << 20  # of JSONL and CSV per record batch
STDIN = "-"


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path in it) of a local path or a URI (s3://bucket/key, file:///...)."""
    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), str(Path(uri).resolve())


def input_format(uri: str, given: str | None) -> str:
    if given is not None:
        return given
    path = Path(uri.split("?")[0].lower())
    if path.suffix in COMPRESSIONS:
        path = path.with_suffix("")
    if path.suffix not in FORMATS:
        known = "give --input-format jsonl, csv or parquet"
        raise JobError(f"cannot tell the format of {uri} from its suffix: {known}")
    return FORMATS[path.suffix]


@dataclass(frozen=True, slots=True)
class Shard:
    index: int
    ids: list[Any]  # the id column's values, or row numbers
    texts: list[str]


@dataclass(frozen=True, slots=True)
class Source:
    uri: str
    format: str
    text_column: str
    id_column: str | None  # None: a row's number (from 0) is its id

    def why_not_counted(self) -> str | None:
        """None where num_rows() counts the input's rows up front; otherwise why it does not."""
        if self._is_stream():
            return "a stream"
        if self.format != "parquet" and not isinstance(filesystem(self.uri)[0], pafs.LocalFileSystem):
            return "a remote file, read once"
        return None

    def num_rows(self, stop: threading.Event | None = None) -> int | None:
        """Parquet's from its footer; a local text file's by reading it through the parser shards() reads
        it with (the same rows, whatever its quoted newlines or blank lines), at a fraction of the cost
        of embedding them. None for what why_not_counted() names, or once `stop` is set."""
        if self.why_not_counted() is not None:
            return None
        if self.format == "parquet":
            import pyarrow.parquet as pq

            fs, path = filesystem(self.uri)
            return pq.ParquetFile(path, filesystem=fs).metadata.num_rows
        num_rows = 0
        for batch in self._batches():
            if stop is not None and stop.is_set():
                return None
            num_rows += len(batch)
        return num_rows

    def shards(self, shard_rows: int) -> Iterator[Shard]:
        """Shards of `shard_rows` rows in input order (the last may be shorter)."""
        ids: list[Any] = []
        texts: list[str] = []
        first_row = index = 0
        for batch in self._batches():
            batch_texts, batch_ids = self._columns(batch, first_row + len(texts))
            texts += batch_texts
            ids += batch_ids
            while len(texts) >= shard_rows:
                yield Shard(index, ids[:shard_rows], texts[:shard_rows])
                ids, texts = ids[shard_rows:], texts[shard_rows:]
                first_row += shard_rows
                index += 1
        if texts:
            yield Shard(index, ids, texts)

    def _columns(self, batch: pa.RecordBatch, first_row: int) -> tuple[list[str], list[Any]]:
        names = batch.schema.names
        if self.text_column not in names:
            column = self.text_column
            raise JobError(f"{self.uri} has no column '{column}' (it has {names}): give --text-column")
        texts = batch.column(self.text_column)
        if texts.null_count:
            row = first_row + texts.is_null().to_pylist().index(True)
            raise JobError(f"{self.uri}: row {row} has no '{self.text_column}'")
        if not pa.types.is_string(texts.type) and not pa.types.is_large_string(texts.type):
            raise JobError(f"{self.uri}: column '{self.text_column}' holds {texts.type}, not text")
        if self.id_column is None:
            return texts.to_pylist(), list(range(first_row, first_row + len(batch)))
        if self.id_column not in names:
            raise JobError(f"{self.uri} has no column '{self.id_column}' (it has {names}): give --id-column")
        return texts.to_pylist(), batch.column(self.id_column).to_pylist()

    def _is_stream(self) -> bool:
        """stdin, a pipe, a FIFO: read once as it comes, with no size."""
        if self.uri == STDIN:
            return True
        fs, path = filesystem(self.uri)
        return isinstance(fs, pafs.LocalFileSystem) and fs.get_file_info(path).type == pafs.FileType.Unknown

    def _open_text(self) -> contextlib.AbstractContextManager[BinaryIO | pa.NativeFile]:
        """The bytes of a JSONL or CSV input: a file's, decompressed where its suffix says so, or a
        stream's, opened in Python, since pyarrow seeks in what it opens and a pipe cannot."""
        if self.uri == STDIN:
            return contextlib.nullcontext(sys.stdin.buffer)
        fs, path = filesystem(self.uri)
        if self._is_stream():
            return open(path, "rb")
        return fs.open_input_stream(path)

    def _batches(self) -> Iterator[pa.RecordBatch]:
        fs, path = filesystem(self.uri)
        try:
            if self.format == "parquet":
                import pyarrow.parquet as pq

                if self._is_stream():
                    raise JobError(f"{self.uri} is a stream: Parquet is read from its footer, so give a file")
                columns = [self.text_column] + ([self.id_column] if self.id_column else [])
                parquet = pq.ParquetFile(path, filesystem=fs)
                missing = [name for name in columns if name not in parquet.schema_arrow.names]
                if missing:
                    names = parquet.schema_arrow.names
                    raise JobError(f"{self.uri} has no column {missing[0]!r} (it has {names})")
                yield from parquet.iter_batches(batch_size=64 * 1024, columns=columns)
                return
            with self._open_text() as stream:
                yield from self._text_batches(stream)
        except FileNotFoundError as error:
            raise JobError(f"no input at {self.uri}") from error
        except pa.ArrowInvalid as error:
            raise JobError(f"{self.uri} is not valid {self.format}: {error}") from error

    def _text_batches(self, stream) -> Iterator[pa.RecordBatch]:
        # ids and texts read as written: a numeric-looking text column stays text
        types = {self.text_column: pa.string()}
        if self.format == "csv":
            import pyarrow.csv as csv

            reader = csv.open_csv(
                stream,
                read_options=csv.ReadOptions(block_size=READ_BLOCK_BYTES),
                # a quoted newline may fall on a block's edge: without this the parser loses its place there
                parse_options=csv.ParseOptions(newlines_in_values=True),
                convert_options=csv.ConvertOptions(column_types=types),
            )
        else:
            import pyarrow.json as json

            schema = pa.schema([(self.text_column, pa.string())])
            reader = json.open_json(
                stream,
                read_options=json.ReadOptions(block_size=READ_BLOCK_BYTES),
                parse_options=json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer"),
            )
        yield from reader
