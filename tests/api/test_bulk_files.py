"""A bulk job's files: JSONL, CSV and Parquet read into the same shards in input order (ids from a column
or row numbers), clear errors for what cannot be embedded, and the output folder's shards and manifest
(a rerun takes up the same job's shards, refuses another job's, and notices a changed input)."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from api.bulk import source as source_module
from api.bulk.errors import JobError
from api.bulk.output import MANIFEST, Output, fixed_size_vectors, read_output, shard_file, sparse_vectors
from api.bulk.source import Source, input_format

TEXTS = [f"text number {i}" for i in range(10)]
IDS = [f"doc-{i}" for i in range(10)]


def write_inputs(folder):
    (folder / "in.jsonl").write_text(
        "".join(json.dumps({"id": i, "text": t, "extra": 1}) + "\n" for i, t in zip(IDS, TEXTS))
    )
    (folder / "in.csv").write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in zip(IDS, TEXTS)))
    pq.write_table(pa.table({"id": IDS, "text": TEXTS}), folder / "in.parquet", row_group_size=3)
    return [folder / name for name in ("in.jsonl", "in.csv", "in.parquet")]


def test_every_format_gives_the_same_shards_in_input_order(tmp_path):
    for path in write_inputs(tmp_path):
        source = Source(str(path), input_format(str(path), None), "text", "id")
        shards = list(source.shards(4))
        assert [shard.index for shard in shards] == [0, 1, 2]
        assert [len(shard.texts) for shard in shards] == [4, 4, 2]
        assert sum((shard.texts for shard in shards), []) == TEXTS
        assert sum((shard.ids for shard in shards), []) == IDS
        assert source.num_rows() == 10


def test_without_an_id_column_a_row_number_is_the_id(tmp_path):
    path = write_inputs(tmp_path)[0]
    shards = list(Source(str(path), "jsonl", "text", None).shards(3))
    assert sum((shard.ids for shard in shards), []) == list(range(10))


def test_a_numeric_looking_text_column_stays_text(tmp_path):
    path = tmp_path / "numbers.csv"
    path.write_text("text\n12\n3.5\n")
    (shard,) = Source(str(path), "csv", "text", None).shards(10)
    assert shard.texts == ["12", "3.5"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.csv", "body\na\n", "no column 'text'"),
        ("bad.jsonl", '{"body": "a"}\n', "row 0 has no 'text'"),
        ("bad.jsonl", '{"text": "a"}\n{"text": null}\n', "row 1 has no 'text'"),
        ("bad.jsonl", '{"text": "a"\n', "not valid jsonl"),
    ],
)
def test_what_cannot_be_embedded_is_a_job_error_naming_it(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(JobError, match=message):
        list(Source(str(path), input_format(name, None), "text", None).shards(10))


def test_a_missing_input_or_an_unknown_suffix_is_a_job_error(tmp_path):
    with pytest.raises(JobError, match="no input at"):
        list(Source(str(tmp_path / "none.jsonl"), "jsonl", "text", None).shards(10))
    with pytest.raises(JobError, match="--input-format"):
        input_format("corpus.txt", None)


def test_a_csvs_quoted_newlines_are_read_on_whatever_block_edge_they_fall(tmp_path, monkeypatch):
    monkeypatch.setattr(source_module, "READ_BLOCK_BYTES", 1_000)  # many blocks, edges inside quotes
    texts = [f'line one of {i}\nline two, "quoted"' for i in range(300)]
    rows = "".join(f'{i},"{text.replace(chr(34), chr(34) * 2)}"\n' for i, text in enumerate(texts))
    (tmp_path / "in.csv").write_text("id,text\n" + rows)
    source = Source(str(tmp_path / "in.csv"), "csv", "text", "id")
    assert sum((shard.texts for shard in source.shards(64)), []) == texts


def test_output_shards_read_back_in_order_and_a_rerun_takes_them_up(tmp_path):
    job = {"input": "in.parquet", "model": "m"}
    output = Output(str(tmp_path / "out"), job)
    output.open()
    vectors = np.arange(15, dtype=np.float32).reshape(5, 3)
    second = output.open_shard(1, "id")  # written first, in two row groups, the second in two parts
    second.write(["c"], [fixed_size_vectors(vectors[2:3])])
    second.write(["d", "e"], [fixed_size_vectors(vectors[3:4]), fixed_size_vectors(vectors[4:])])
    second.close()
    first = output.open_shard(0, "id")
    first.write(["a", "b"], [fixed_size_vectors(vectors[:2])])
    first.close()
    output.finish()
    table = read_output(str(tmp_path / "out"))
    assert table.column("id").to_pylist() == ["a", "b", "c", "d", "e"]
    assert np.array_equal(np.array(table.column("embedding").to_pylist(), dtype=np.float32), vectors)
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 3)
    files = sorted(path.name for path in (tmp_path / "out").iterdir())
    assert files == [MANIFEST, shard_file(0), shard_file(1)]  # no partial file left behind

    again = Output(str(tmp_path / "out"), job)
    again.open()
    assert again.complete and sorted(again.shards) == [0, 1]
    again.check_finished(0, ["a", "b"])
    again.check_finished(1, ["c", "d", "e"])
    with pytest.raises(JobError, match="the input changed"):
        again.check_finished(1, ["c", "d", "x"])
    with pytest.raises(JobError, match="another job"):
        Output(str(tmp_path / "out"), {**job, "model": "other"}).open()


def test_a_shard_with_ids_of_another_type_midway_or_discarded_is_never_recorded(tmp_path):
    output = Output(str(tmp_path / "out"), {"input": "in.parquet"})
    output.open()
    vectors = fixed_size_vectors(np.ones((2, 3), dtype=np.float32))
    mixed = output.open_shard(0, "id")
    mixed.write([1, 2], [vectors])
    with pytest.raises(JobError, match="the ids of shard 0 are not all int64"):
        mixed.write(["a", "b"], [vectors])
    mixed.discard()
    stopped = output.open_shard(1, "id")
    stopped.write([3, 4], [vectors])
    stopped.discard()  # as when the job stops midway through a shard
    assert output.shards == {}
    assert sorted(path.name for path in (tmp_path / "out").iterdir() if not path.name.startswith(".")) == [
        MANIFEST
    ]


def test_sparse_vectors_are_each_rows_nonzero_weights_by_token_id():
    weights = np.zeros((3, 10), dtype=np.float32)
    weights[0, [7, 2]] = [0.5, 1.25]
    weights[2, 9] = 3.0  # row 1: no weight at all
    column = sparse_vectors(weights)
    assert column.to_pylist() == [
        {"indices": [2, 7], "values": [1.25, 0.5]},
        {"indices": [], "values": []},
        {"indices": [9], "values": [3.0]},
    ]
    assert column.type.field("indices").type == pa.list_(pa.int32())
