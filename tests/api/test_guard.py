"""What one request may ask of the model: --max-request-tokens (rerank counts its pairs), --request-timeout
(504, queued work dropped) and a client's disconnect (queued work dropped), in each API's shape."""

import asyncio
import dataclasses
import threading
import time

import numpy as np
import pytest
import torch
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from api.server import Server
from engine.config import EngineConfig
from engine.engine import Engine
from tests.conftest import build_cross_encoder, embedder_output

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

MAX_REQUEST_TOKENS = 64
BLOCKER = [7, 7]  # the token ids of the request that holds the engine's worker


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(max_request_tokens=MAX_REQUEST_TOKENS, request_timeout=30, accept_token_ids=True)
    return Server(config)


@pytest.fixture(scope="module")
def client(server):
    with TestClient(create_app(server.config, server)) as test_client:
        yield test_client


def words(num_words: int) -> str:
    """num_words tokens of MiniLM's vocabulary (plus [CLS] and [SEP] as a model input)."""
    return " ".join(["word"] * num_words)


class UnreachableEngine:
    """A request over the token limit must be refused before anything reaches the engine, and before work
    past the limit is estimated (a guess of an input's tokens, below the limit, is asked before it is
    tokenized: None, not measured)."""

    output = embedder_output()

    def estimate_seconds(self, num_tokens):
        if num_tokens > MAX_REQUEST_TOKENS:
            raise AssertionError("work over --max-request-tokens was estimated")
        return None

    def backlog_seconds(self, num_tokens):  # asked before anything is queued
        return None

    def enqueue(self, token_ids, token_type_ids=None, deadline=None, rows=None):
        raise AssertionError("a request over --max-request-tokens reached the engine")


@pytest.fixture
def engine_swap(server, client):
    model = server.registry().models[0]
    real_engine = model.engine

    def swap(engine):
        model.engine = engine
        return engine

    yield swap
    model.engine = real_engine


def test_embeddings_over_the_token_limit_are_400_naming_both_counts(client, engine_swap):
    # two inputs of 30 words are 2 x 32 tokens: exactly the limit
    assert client.post("/v1/embeddings", json={"input": [words(30)] * 2}).status_code == 200
    engine_swap(UnreachableEngine())
    response = client.post("/v1/embeddings", json={"input": [words(30)] * 3})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "input"
    assert "96 tokens" in error["message"] and f"limit of {MAX_REQUEST_TOKENS}" in error["message"]
    # token-id inputs count the same way
    response = client.post("/v1/embeddings", json={"input": [[2773] * 33] * 2})
    assert response.status_code == 400 and "66 tokens" in response.json()["error"]["message"]


def test_rerank_over_the_token_limit_is_400_for_cohere_and_413_for_tei(client, engine_swap):
    # an embedding model scores the query (3 tokens) and each document (32) as separate sequences
    body = {"query": "bread", "documents": [words(30)]}
    assert client.post("/v2/rerank", json=body).status_code == 200
    engine_swap(UnreachableEngine())
    body = {"query": "bread", "documents": [words(30)] * 2}
    for route in ("/v1/rerank", "/v2/rerank"):
        response = client.post(route, json=body)
        assert response.status_code == 400, response.text
        assert "67 tokens" in response.json()["message"]
    response = client.post("/rerank", json={"query": "bread", "texts": [words(30)] * 2})
    assert response.status_code == 413, response.text
    assert response.json()["error_type"] == "Validation" and "67 tokens" in response.json()["error"]


def test_a_cross_encoder_counts_the_query_in_every_pair(minilm_path, tmp_path):
    config = ServerConfig(models=(str(build_cross_encoder(minilm_path, tmp_path)),), max_request_tokens=64)
    with TestClient(create_app(config)) as client:
        # pairs are [CLS] query [SEP] document [SEP]: 10 + 10 + 3 = 23 tokens each
        body = {"query": words(10), "documents": [words(10)] * 2}
        assert client.post("/v2/rerank", json=body).status_code == 200
        response = client.post("/v2/rerank", json={**body, "documents": [words(10)] * 3})
        assert response.status_code == 400 and "69 tokens" in response.json()["message"]


class Rows:
    def __init__(self, num_seqs: int):
        self.rows = np.ones((num_seqs, 384), dtype=np.float32)

    def result(self) -> np.ndarray:
        return self.rows

    def all_finite(self) -> bool:
        return bool(np.isfinite(self.rows).all())


class GatedRunner:
    """Holds the engine's worker in step() until the gate opens; records the ids of every batch."""

    device = torch.device("cpu")
    computes_on_launch = True
    output = embedder_output()

    def __init__(self):
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[list[int]] = []

    def step(self, batch) -> Rows:
        self.entered.set()
        self.gate.wait(30)
        self.batches.append(batch.input_ids.tolist())
        return Rows(batch.num_seqs)


@pytest.fixture
def held_engine(client, engine_swap):
    """A real engine (scheduler and worker) whose worker is busy with a blocker request: a request's
    sequences stay queued until `release()`, which lets the blocker finish and the worker go on."""
    runner = GatedRunner()
    engine = engine_swap(Engine(runner, EngineConfig(max_batch_tokens=512, max_queue_tokens=4096)))
    engine.start()
    blocker = client.blocking_portal.start_task_soon(engine.run, [BLOCKER])
    assert runner.entered.wait(10)

    def release() -> list[list[int]]:
        """Open the gate; once the blocker is done, the ids of every batch the model ran."""
        runner.gate.set()
        blocker.result(timeout=10)
        deadline = time.monotonic() + 5
        while engine.queued_tokens and time.monotonic() < deadline:
            time.sleep(0.01)
        return runner.batches

    yield engine, release
    runner.gate.set()
    engine.stop()


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/embeddings", {"input": ["a queued text", "another"]}),
        ("/v2/rerank", {"query": "q", "documents": ["a queued document"]}),
        ("/rerank", {"query": "q", "texts": ["a queued text"]}),
    ],
)
def test_a_request_past_its_timeout_is_504_and_its_queued_work_is_dropped(
    server, client, held_engine, monkeypatch, route, body
):
    engine, release = held_engine
    monkeypatch.setattr(server, "config", dataclasses.replace(server.config, request_timeout=0.3))
    response = client.post(route, json=body)
    assert response.status_code == 504, response.text
    payload = response.json()
    if route == "/v1/embeddings":
        assert payload["error"]["type"] == "timeout" and payload["error"]["code"] is None
        assert "--request-timeout" in payload["error"]["message"]
    elif route == "/rerank":
        assert payload["error_type"] == "Backend" and set(payload) == {"error", "error_type"}
    else:
        assert list(payload) == ["message"]
    assert engine.queued_tokens > 0  # still queued behind the blocker, its future cancelled
    assert release() == [BLOCKER]  # the model never ran the timed-out request
    assert engine.queued_tokens == 0


async def post_then_disconnect(app, route: str, body: bytes, engine: Engine) -> int:
    """POST through the ASGI interface as a server would, and report the client's disconnect once the
    request's sequences are queued; the status the app answered (nobody would read it)."""
    gone = asyncio.Event()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": route,
        "raw_path": route.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 40000),
        "server": ("posy", 80),
        "state": {},
    }
    handling = asyncio.ensure_future(app(scope, receive, send))
    deadline = time.monotonic() + 10
    while not engine.queued_tokens and not handling.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    gone.set()
    await asyncio.wait_for(handling, 10)
    return next(message["status"] for message in sent if message["type"] == "http.response.start")


@pytest.mark.parametrize(
    "route, body",
    [
        ("/v1/embeddings", b'{"input": ["a text whose client goes away"]}'),
        ("/v1/rerank", b'{"query": "q", "documents": ["a document whose client goes away"]}'),
        ("/rerank", b'{"query": "q", "texts": ["a text whose client goes away"]}'),
    ],
)
def test_a_client_disconnect_drops_its_queued_work(client, held_engine, route, body):
    engine, release = held_engine
    status = client.blocking_portal.call(post_then_disconnect, client.app, route, body, engine)
    assert status == 499  # nginx's "client closed request": it shows in the metrics
    assert engine.queued_tokens > 0  # queued behind the blocker, its future cancelled
    assert release() == [BLOCKER]  # the model never ran it
    assert engine.queued_tokens == 0


def test_the_server_serves_after_timeouts_and_disconnects(client):
    response = client.post("/v1/embeddings", json={"input": "still serving"})
    assert response.status_code == 200 and len(response.json()["data"][0]["embedding"]) == 384
    metrics = client.get("/metrics").text
    assert 'posy_requests_total{route="/v1/embeddings",status="499"}' in metrics
    assert 'posy_requests_total{route="/v1/embeddings",status="504"}' in metrics
