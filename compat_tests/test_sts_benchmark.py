"""STS Benchmark (test split) through POST /v1/embeddings: Spearman x 100 must match sentence-transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from .contract import MODEL

STS_TEST = Path(__file__).resolve().parents[2] / "shared" / "data" / "stsbenchmark" / "sts-test.csv"
REFERENCE_SPEARMAN = 82.03  # sentence-transformers' all-MiniLM-L6-v2 on sts-test
TOLERANCE = 0.05
BATCH_SIZE = 256


def read_sts(path: Path) -> tuple[list[float], list[str], list[str]]:
    # Split on tabs by hand: the csv module's quoting merges rows that contain a lone quote.
    scores, first, second = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        columns = line.split("\t")
        scores.append(float(columns[4]))
        first.append(columns[5])
        second.append(columns[6])
    return scores, first, second


def test_sts_benchmark_spearman(http):
    if not STS_TEST.is_file():
        pytest.skip(f"STS Benchmark test split not found at {STS_TEST}")
    gold, first, second = read_sts(STS_TEST)
    assert len(gold) == 1379, "sts-test.csv should hold 1,379 pairs"
    sentences = first + second
    rows = []
    for start in range(0, len(sentences), BATCH_SIZE):
        batch = sentences[start : start + BATCH_SIZE]
        body = {"model": MODEL, "input": batch, "encoding_format": "float"}
        response = http.post("/v1/embeddings", json=body)
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        assert [item["index"] for item in data] == list(range(len(batch)))
        rows.extend(item["embedding"] for item in data)
    vectors = np.array(rows, dtype=np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    a, b = vectors[: len(first)], vectors[len(first) :]
    spearman = spearmanr(gold, np.sum(a * b, axis=1)).statistic * 100
    print(f"STS Benchmark test, Spearman x 100 through posy: {spearman:.2f} (reference {REFERENCE_SPEARMAN})")
    assert abs(spearman - REFERENCE_SPEARMAN) <= TOLERANCE, spearman
