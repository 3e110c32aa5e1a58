"""A bulk job's input beyond a plain file: rows counted as the job reads them (a CSV's quoted newlines,
blank lines), compressed files read and counted decompressed, streams (a FIFO, stdin) read once and not
counted, remote text files not counted."""

import gzip
import io
import json
import os
import sys
import threading

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from api.bulk import source as source_module
from api.bulk.errors import JobError
from api.bulk.source import STDIN, Source, input_format

QUOTED = [f'line one of {i}\nline two, "quoted"' for i in range(300)]


def write_quoted_csv(path):
    rows = "".join(f'{i},"{text.replace(chr(34), chr(34) * 2)}"\n\n' for i, text in enumerate(QUOTED))
    path.write_text("id,text\n" + rows)  # a blank line after each record, which is no row


def test_a_csv_with_quoted_newlines_counts_its_records_and_reads_them_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(source_module, "READ_BLOCK_BYTES", 1_000)  # many blocks, edges inside quotes
    write_quoted_csv(tmp_path / "in.csv")
    source = Source(str(tmp_path / "in.csv"), "csv", "text", "id")
    assert source.why_not_counted() is None and source.num_rows() == len(QUOTED)
    assert sum((shard.texts for shard in source.shards(64)), []) == QUOTED


def test_a_jsonl_counts_its_rows_not_its_lines(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "a"}\n\n   \n{"text": "b"}\n{"text": "c"}')  # blank lines, no last newline
    assert Source(str(path), "jsonl", "text", None).num_rows() == 3


def test_a_compressed_input_is_read_and_counted_decompressed(tmp_path):
    texts = [f"text {i}" for i in range(50)]
    path = tmp_path / "in.jsonl.gz"
    with gzip.open(path, "wt") as file:
        file.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    source = Source(str(path), input_format(str(path), None), "text", None)
    assert source.format == "jsonl" and source.num_rows() == 50
    assert sum((shard.texts for shard in source.shards(20)), []) == texts
    assert input_format("corpus.CSV.zst", None) == "csv"


def test_a_count_stops_when_told(tmp_path):
    write_quoted_csv(tmp_path / "in.csv")
    stop = threading.Event()
    stop.set()
    assert Source(str(tmp_path / "in.csv"), "csv", "text", None).num_rows(stop) is None


def test_a_fifo_is_a_stream_read_once_and_not_counted(tmp_path):
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)
    texts = [f"text {i}" for i in range(30)]

    def write():
        with open(path, "w") as pipe:
            pipe.writelines(json.dumps({"text": text}) + "\n" for text in texts)

    source = Source(str(path), "jsonl", "text", None)
    assert source.why_not_counted() == "a stream" and source.num_rows() is None  # nothing read
    writer = threading.Thread(target=write)
    writer.start()
    assert sum((shard.texts for shard in source.shards(7)), []) == texts
    writer.join()


def test_stdin_is_a_stream_but_not_for_parquet(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"text\nfirst\nsecond\n")))
    source = Source(STDIN, "csv", "text", None)
    assert source.why_not_counted() == "a stream" and source.num_rows() is None
    assert [shard.texts for shard in source.shards(10)] == [["first", "second"]]
    with pytest.raises(JobError, match="is a stream: Parquet is read from its footer"):
        list(Source(STDIN, "parquet", "text", None).shards(10))
    with pytest.raises(JobError, match="--input-format"):
        input_format(STDIN, None)


def test_a_remote_text_file_is_read_once_but_a_remote_parquet_counted_from_its_footer(tmp_path, monkeypatch):
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), tmp_path / "in.parquet")
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n')
    remote = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())  # not a local one, as S3's
    monkeypatch.setattr(source_module, "filesystem", lambda uri: (remote, uri.removeprefix("remote://")))
    text = Source("remote://in.jsonl", "jsonl", "text", None)
    assert text.why_not_counted() == "a remote file, read once" and text.num_rows() is None
    assert Source("remote://in.parquet", "parquet", "text", None).num_rows() == 3
