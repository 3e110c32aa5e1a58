"""The bulk-job tests' corpus: rows of STS Benchmark sentences (both columns of the test split, cycled)
with ids in input order, as Parquet, and what POST /v1/embeddings gives for each distinct text."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .conftest import REPO_ROOT, server_env

STS_TEST = REPO_ROOT.parent / "shared" / "data" / "stsbenchmark" / "sts-test.csv"
NUM_ROWS = 2_000  # of the STS test split's 2,758 sentences; the local job's 10 shards take 10 s on 2 cores
SAME_VECTOR = 0.9999  # cosine, fp32 on both sides
JOB_TIMEOUT_S = 900


@dataclass(frozen=True, slots=True)
class Corpus:
    path: Path  # Parquet: "id", "text"
    ids: list[str]
    texts: list[str]


def sts_sentences() -> list[str]:
    sentences = []
    for line in STS_TEST.read_text(encoding="utf-8").splitlines():
        columns = line.split("\t")
        if len(columns) >= 7:
            sentences += columns[5:7]
    return sentences


def write_corpus(folder: Path, num_rows: int = NUM_ROWS) -> Corpus:
    sentences = sts_sentences()
    texts = [sentences[row % len(sentences)] for row in range(num_rows)]
    ids = [f"row-{row:05d}" for row in range(num_rows)]  # sorting by id is input order
    path = folder / "corpus.parquet"
    # row groups of 3/8 of the rows: a tenth of the rows (a job's shard) crosses their boundaries
    pq.write_table(pa.table({"id": ids, "text": texts}), path, row_group_size=3 * num_rows // 8)
    return Corpus(path, ids, texts)


def http_vectors(embed: Callable[..., np.ndarray], texts: list[str]) -> dict[str, np.ndarray]:
    """/v1/embeddings' vector of every distinct text."""
    distinct = sorted(set(texts))
    rows = np.concatenate([embed(distinct[start : start + 512]) for start in range(0, len(distinct), 512)])
    return dict(zip(distinct, rows))


def assert_rows_match(table: pa.Table, corpus: Corpus, expected: dict[str, np.ndarray]) -> None:
    """The output holds every corpus row once, in input order by id, each vector /v1/embeddings'."""
    table = table.sort_by("id")
    assert table.column("id").to_pylist() == corpus.ids
    vectors = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    reference = np.stack([expected[text] for text in corpus.texts])
    cosines = np.sum(vectors * reference, axis=1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
    )
    assert cosines.min() >= SAME_VECTOR, (cosines.argmin(), cosines.min())


def posy_embed(
    *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`posy embed ...` as a user runs it (python -m api: the same entry point)."""
    command = [sys.executable, "-m", "api", "embed", *args]
    environment = {**server_env(), **(env or {})}
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=JOB_TIMEOUT_S
    )
    if check:
        assert done.returncode == 0, done.stderr[-4000:]
    return done
