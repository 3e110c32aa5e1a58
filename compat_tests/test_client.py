"""clients.Client and AsyncClient against a live server (the bundled model on the CPU): the same vectors
and ranking as direct calls, lists or numpy, the API key, typed errors, and a 429 retried after its
Retry-After until the queue has room."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest

from clients import AsyncClient, Client, InvalidRequest, Overloaded, RetryPolicy

from .contract import MODEL

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

TEXTS = ["the cat sat on the mat", "a dog in the park", "stock markets fell today", "kittens play"]
QUERY = "cats"


def direct_ranking(http: httpx.Client, documents: list[str]) -> list[tuple[int, float]]:
    response = http.post("/v2/rerank", json={"model": MODEL, "query": QUERY, "documents": documents})
    assert response.status_code == 200, response.text
    return [(result["index"], result["relevance_score"]) for result in response.json()["results"]]


def test_embed_gives_the_direct_calls_vectors_as_lists_or_numpy(base_url, embed):
    expected = embed(TEXTS)
    with Client(base_url) as client:
        rows = client.embed(TEXTS)
        assert isinstance(rows, list) and len(rows) == len(TEXTS) and len(rows[0]) == expected.shape[1]
        np.testing.assert_allclose(np.array(rows), expected, rtol=0, atol=1e-6)
        array = client.embed(TEXTS, model=MODEL, as_numpy=True)
        assert array.dtype == np.float32 and array.shape == expected.shape
        np.testing.assert_allclose(array, expected, rtol=0, atol=1e-6)
        truncated = client.embed(TEXTS[:1], dimensions=64, as_numpy=True)
        assert truncated.shape == (1, 64)


def test_rerank_gives_the_direct_calls_order_and_scores(base_url, http):
    expected = direct_ranking(http, TEXTS)
    with Client(base_url) as client:
        results = client.rerank(QUERY, TEXTS, return_documents=True)
        top = client.rerank(QUERY, TEXTS, top_n=2)
    assert [(result.index, result.relevance_score) for result in results] == expected
    assert [result.document for result in results] == [TEXTS[index] for index, _ in expected]
    assert [result.index for result in top] == [index for index, _ in expected[:2]]


def test_the_async_client_gives_the_same_answers(base_url, embed, http):
    async def main():
        async with AsyncClient(base_url) as client:
            return await asyncio.gather(client.embed(TEXTS, as_numpy=True), client.rerank(QUERY, TEXTS))

    vectors, results = asyncio.run(main())
    np.testing.assert_allclose(vectors, embed(TEXTS), rtol=0, atol=1e-6)
    assert [(result.index, result.relevance_score) for result in results] == direct_ranking(http, TEXTS)


def test_errors_are_typed_and_not_retried(base_url):
    retries = []
    with Client(base_url, on_retry=lambda *args: retries.append(args)) as client:
        with pytest.raises(InvalidRequest) as raised:
            client.embed(TEXTS, model="no-such-model")
        assert raised.value.status_code in (400, 404) and "no-such-model" in raised.value.message
        assert raised.value.request_id
        with pytest.raises(TypeError):
            client.embed("one string, not a list")
    assert retries == []


# a server with an API key and a tiny queue (512 tokens), which the tests below share
KEY = "sesame"
SECURED_SMALL = (
    "--api-key", KEY, "--device", "cpu", "--max-queue-tokens", "512", "--max-batch-tokens", "512",
)  # fmt: skip


def test_the_api_key_is_sent(server_factory):
    secured = server_factory(*SECURED_SMALL)
    with Client(secured.url, api_key=KEY) as client:
        assert len(client.embed(TEXTS[:1])) == 1
    with Client(secured.url, api_key="wrong") as client, pytest.raises(InvalidRequest) as raised:
        client.embed(TEXTS[:1])
    assert raised.value.status_code == 401


def test_a_429_is_retried_after_its_retry_after_until_the_queue_has_room(server_factory):
    # a tiny queue: a large request fills it for seconds, during which others get 429 + Retry-After
    small = server_factory(*SECURED_SMALL)
    filler = [f"filler text number {index} " + "with many words in it " * 8 for index in range(300)]
    admitted = threading.Event()

    def fill() -> None:
        with httpx.Client(timeout=300, headers={"authorization": f"Bearer {KEY}"}) as http:
            admitted.set()
            assert http.post(f"{small.url}/v1/embeddings", json={"input": filler}).status_code == 200

    filling = threading.Thread(target=fill)
    filling.start()
    admitted.wait()
    time.sleep(0.5)  # the filler is queued: its tokens are far above the queue's 512
    retries: list[tuple[int, int | None, float]] = []
    patient = RetryPolicy(max_retries=60)
    with Client(small.url, api_key=KEY, retry=patient, on_retry=lambda *args: retries.append(args)) as client:
        started = time.monotonic()
        rows = client.embed(TEXTS, as_numpy=True)
        waited = time.monotonic() - started
    filling.join()
    assert rows.shape[0] == len(TEXTS)
    assert retries and all(status == 429 and delay >= 1.0 for _, status, delay in retries), retries
    assert waited >= sum(delay for *_, delay in retries)  # each Retry-After was honoured in full
    with Client(small.url, api_key=KEY, retry=RetryPolicy(max_retries=0)) as impatient:
        filling = threading.Thread(target=fill)
        filling.start()
        admitted.wait()
        time.sleep(0.5)
        with pytest.raises(Overloaded):
            impatient.embed(TEXTS)
        filling.join()
