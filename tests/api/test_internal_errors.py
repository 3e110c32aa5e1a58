"""A fault inside the server is a 500 in the called API's shape that names the request id (the one in
the x-request-id header and in the log record), with no traceback and no file path in the body."""

import logging

import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from api.server import Server
from engine.errors import EngineError
from tests.conftest import embedder_output

INTERNAL_PATH = "/opt/posy/engine/secret_module.py"


class FaultyEngine:
    output = embedder_output()

    def __init__(self, error: Exception):
        self.error = error

    def estimate_seconds(self, num_tokens):
        return None

    def backlog_seconds(self, num_tokens):  # asked before anything is queued
        return None

    def enqueue(self, token_ids, token_type_ids=None, deadline=None, rows=None):
        raise self.error


@pytest.fixture(scope="module")
def server():
    return Server(ServerConfig())


@pytest.fixture(scope="module")
def client(server):
    with TestClient(create_app(server.config, server)) as test_client:
        yield test_client


@pytest.fixture
def break_engine(server, client):
    model = server.registry().models[0]
    real_engine = model.engine

    def install(error: Exception) -> None:
        model.engine = FaultyEngine(error)

    yield install
    model.engine = real_engine


def openai_message(payload: dict) -> str:
    assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["type"] == "server_error" and payload["error"]["code"] is None
    return payload["error"]["message"]


def cohere_message(payload: dict) -> str:
    assert list(payload) == ["message"]
    return payload["message"]


def tei_message(payload: dict) -> str:
    assert set(payload) == {"error", "error_type"} and payload["error_type"] == "Backend"
    return payload["error"]


ROUTES = [
    ("/v1/embeddings", {"input": "x"}, openai_message),
    ("/v1/rerank", {"query": "q", "documents": ["d"]}, cohere_message),
    ("/v2/rerank", {"query": "q", "documents": ["d"]}, cohere_message),
    ("/rerank", {"query": "q", "texts": ["d"]}, tei_message),
]


def assert_no_internals(text: str) -> None:
    assert "Traceback" not in text and "File " not in text
    assert INTERNAL_PATH not in text and ".py" not in text and "/opt/" not in text


def failing_call(client, break_engine, caplog, error: Exception, route: str, body: dict):
    """POST `route` with the engine raising `error`: the 500 and the request id it names."""
    break_engine(error)
    with caplog.at_level(logging.ERROR, logger="api.errors"):
        response = client.post(route, json=body)
    assert response.status_code == 500, response.text
    return response, response.headers["x-request-id"]


@pytest.mark.parametrize("route, body, message_of", ROUTES)
def test_an_unexpected_error_is_a_500_naming_the_request_id(
    client, break_engine, caplog, route, body, message_of
):
    error = KeyError(f"lost a key in {INTERNAL_PATH}")
    response, request_id = failing_call(client, break_engine, caplog, error, route, body)
    assert message_of(response.json()) == f"internal server error (request id {request_id})"
    assert_no_internals(response.text)
    records = [record for record in caplog.records if getattr(record, "request_id", None) == request_id]
    assert len(records) == 1
    assert request_id in records[0].getMessage()
    assert records[0].exc_info is not None and records[0].exc_info[0] is KeyError  # the traceback: logged


def test_the_callers_request_id_names_the_500(client, break_engine, caplog):
    break_engine(RuntimeError(f"crashed in {INTERNAL_PATH}"))
    with caplog.at_level(logging.ERROR, logger="api.errors"):
        response = client.post("/v1/embeddings", json={"input": "x"}, headers={"x-request-id": "trace-42"})
    assert response.status_code == 500 and response.headers["x-request-id"] == "trace-42"
    assert openai_message(response.json()) == "internal server error (request id trace-42)"
    assert [record.request_id for record in caplog.records if hasattr(record, "request_id")] == ["trace-42"]


@pytest.mark.parametrize("route, body, message_of", ROUTES)
def test_an_engine_failure_is_a_500_naming_the_request_id(
    client, break_engine, caplog, route, body, message_of
):
    error = EngineError(f"model step failed: RuntimeError at {INTERNAL_PATH}")
    response, request_id = failing_call(client, break_engine, caplog, error, route, body)
    assert message_of(response.json()) == f"the model failed on this request (request id {request_id})"
    assert_no_internals(response.text)
    assert [record.request_id for record in caplog.records if hasattr(record, "request_id")] == [request_id]


def test_the_server_keeps_serving_after_500s(client):
    response = client.post("/v1/embeddings", json={"input": "still serving"})
    assert response.status_code == 200 and len(response.json()["data"][0]["embedding"]) == 384
