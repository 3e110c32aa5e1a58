"""STS Benchmark (test split) through POST /v1/embeddings: Spearman x 100 must match sentence-transformers."""

from __future__ import annotations

import numpy as np
from scipy.stats import spearmanr

from benchmarks.texts import read_sts
from tests.sts import sts_test_split

from .contract import MODEL

REFERENCE_SPEARMAN = 82.03  # sentence-transformers' all-MiniLM-L6-v2 on sts-test
TOLERANCE = 0.05
BATCH_SIZE = 256


def test_sts_benchmark_spearman(http):
    gold, first, second = read_sts(sts_test_split())
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
