"""One rule for refusals on every route that runs a model (engine/admission.py), with a stand-in model of
known speed (0.1 ms a token) and --request-timeout 1: work that cannot fit even on an idle server is a 400
(TEI 413) naming the timeout, with no Retry-After; a lone request on an idle server is never a 429, however
large; work that fits but finds the queue busy is a 429 whose Retry-After a retry passes; a draining server
answers 503."""

import json
import time

import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from api.server import Server
from engine.batch import pack
from engine.config import EngineConfig
from engine.engine import Engine
from tests.conftest import TimedRunner

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

SECONDS_PER_TOKEN = 1e-4
TIMEOUT_S = 1.0
TEXT = " ".join(["word"] * 98)  # 100 tokens with [CLS] and [SEP]
QUERY = "which word"

# each route's body for `count` texts of about 100 tokens
ROUTES = {
    "/v1/embeddings": lambda count: {"input": [TEXT] * count},
    "/v2/embed": lambda count: {"texts": [TEXT] * count, "input_type": "search_document"},
    "/v1/rerank": lambda count: {"query": QUERY, "documents": [TEXT] * count},
    "/v2/rerank": lambda count: {"query": QUERY, "documents": [TEXT] * count},
    "/rerank": lambda count: {"query": QUERY, "texts": [TEXT] * count},
    "/embed": lambda count: {"inputs": [TEXT] * count},
    "/score": lambda count: {"text_1": QUERY, "text_2": [TEXT] * count},
    "/pooling": lambda count: {"input": [TEXT] * count},
}
TEI = {"/rerank", "/embed"}
COHERE = {"/v2/embed", "/v1/rerank", "/v2/rerank"}


@pytest.fixture(scope="module")
def served():
    server = Server(ServerConfig(request_timeout=TIMEOUT_S))
    with TestClient(create_app(server.config, server)) as client:
        model = server.registry().models[0]
        real_engine = model.engine
        engine = Engine(TimedRunner(SECONDS_PER_TOKEN, 384), EngineConfig(max_batch_tokens=1024))
        engine.probe_batch = pack([[0] * 128])
        engine.probe()
        engine.start()
        model.engine = engine
        try:
            yield client, engine, server
        finally:
            model.engine = real_engine
            engine.stop()


def message_of(route: str, response) -> str:
    body = response.json()
    if route in TEI:
        return body["error"]
    if route in COHERE:
        return body["message"]
    return body["error"]["message"]


def wait_idle(engine: Engine) -> None:
    deadline = time.monotonic() + 10
    while engine.queued_tokens or engine.rate.busy_since is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_work_that_never_fits_is_a_400_naming_the_timeout(served, route):
    client, engine, _ = served
    wait_idle(engine)
    response = client.post(route, json=ROUTES[route](100))  # 10,000 tokens: 1 s, stretched 2 s
    assert response.status_code == (413 if route in TEI else 400), response.text[:300]
    assert "--request-timeout" in message_of(route, response)
    assert "retry-after" not in response.headers


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_lone_request_on_an_idle_server_is_never_a_429(served, route):
    """From one text to past what fits: answered, or refused for good; never 'retry later' where no retry
    would find the server any idler."""
    client, engine, _ = served
    for count in (1, 40, 60, 200):  # 60: a 429 for ever before (its estimate fit, stretched it did not)
        wait_idle(engine)
        response = client.post(route, json=ROUTES[route](count))
        assert response.status_code in (200, 400, 413), (count, response.text[:300])


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_work_behind_a_busy_queue_is_a_429_that_its_retry_after_passes(served, route):
    client, engine, _ = served
    wait_idle(engine)
    queued = client.blocking_portal.call(lambda: _enqueue(engine, 12))  # 1.2 s of work ahead, no deadline
    response = client.post(route, json=ROUTES[route](5))
    assert response.status_code == 429, response.text[:300]
    retry_after = int(response.headers["retry-after"])
    assert retry_after == 1
    time.sleep(retry_after)
    retried = client.post(route, json=ROUTES[route](5))
    assert retried.status_code == 200, retried.text[:300]
    client.blocking_portal.call(lambda: queued)


async def _enqueue(engine: Engine, count: int):
    return engine.enqueue([[1] * 1000] * count)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_draining_server_answers_503(served, route):
    client, _, server = served
    server.draining = True
    try:
        response = client.post(route, json=ROUTES[route](1))
    finally:
        server.draining = False
    assert response.status_code == 503 and response.headers["retry-after"] == "1", response.text[:300]
    assert response.headers["connection"] == "close"


def test_one_long_document_on_an_idle_server_is_answered_or_refused_for_good_never_retry_later(served):
    """The issue's case: one document of 500 KB or 5 MB to /v2/rerank got a 429 every time on an idle
    server; rerank reads max_tokens_per_doc of it (4,096 tokens by default)."""
    client, engine, _ = served
    for size in (500_000, 5_000_000):
        document = ("the cat sat on the mat by the warm window " * (size // 40))[:size]
        for route, extra in (
            ("/v2/rerank", {}),
            ("/v1/rerank", {}),
            ("/v2/rerank", {"max_tokens_per_doc": 512}),
        ):
            wait_idle(engine)
            body = json.dumps({"query": QUERY, "documents": [document], **extra})
            response = client.post(route, content=body, headers={"content-type": "application/json"})
            assert response.status_code in (200, 400), (size, route, response.text[:300])
            if response.status_code == 400:
                assert "--request-timeout" in response.json()["message"]
    # what fits the timeout is answered
    wait_idle(engine)
    document = "the cat sat on the mat by the warm window " * 12_500
    response = client.post(
        "/v2/rerank", json={"query": QUERY, "documents": [document], "max_tokens_per_doc": 512}
    )
    assert response.status_code == 200, response.text[:300]


def test_an_operator_sees_the_estimates_and_the_refusals_in_metrics_and_the_log(served, caplog):
    client, engine, server = served
    wait_idle(engine)
    assert client.post("/v1/embeddings", json=ROUTES["/v1/embeddings"](200)).status_code == 400
    server.draining = True
    try:
        with caplog.at_level("WARNING", logger="api.errors"):
            assert client.post("/v1/embeddings", json=ROUTES["/v1/embeddings"](1)).status_code == 503
    finally:
        server.draining = False
    # every 5xx is a line in the log, with its request id
    [line] = [record for record in caplog.records if " 503 on /v1/embeddings" in record.getMessage()]
    assert "shutting down" in line.getMessage()
    metrics = client.get("/metrics").text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in metrics.splitlines()
        if line.startswith("posy_")
    }
    refused = 'posy_refusals_total{reason="never_in_time",route="/v1/embeddings",status="400"}'
    assert samples[refused] >= 1
    model = "sentence-transformers/all-MiniLM-L6-v2"
    per_token = samples[f'posy_admission_seconds_per_token{{model="{model}",replica="0"}}']
    assert per_token == pytest.approx(engine.rate.seconds_per_token, rel=0.01)
    assert samples[f'posy_admission_margin{{model="{model}",replica="0"}}'] == engine.rate.margin
    assert samples[f'posy_admission_tokenizer_seconds_per_char{{model="{model}"}}'] > 0
    assert f'posy_admission_tokenizer_queued_chars{{model="{model}"}}' in samples
    assert "posy_admission_answer_reserve_seconds" in samples and "posy_admission_loop_lag_seconds" in samples
    # and a summary of the refusals, with the estimates they were judged on, at most every few seconds
    hooks = client.app.hot_routes.hooks
    with caplog.at_level("WARNING", logger="api.refusals"):
        hooks.refusals.flush()
    [summary] = [record.getMessage() for record in caplog.records if record.name == "api.refusals"]
    assert "400 never_in_time" in summary and "503 not_ready" in summary
    assert f"{model}: engine {engine.rate.seconds_per_token * 1e3:.4f} ms a token" in summary
