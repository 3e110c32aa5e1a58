"""Admission by time through the HTTP API, with a stand-in model of known speed (0.1 ms a token): a burst
far beyond what the queue can finish within --request-timeout gets only 200s and 429s (each with a
Retry-After), every admitted request finishes inside its timeout, and a request that would outlast the
timeout even on an idle server is a clear 4xx naming its estimate and the flag."""

import asyncio
import dataclasses
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
from engine.service_rate import PROBE_AFTER_S, RECOVERY_HALF_LIFE_S
from tests.conftest import TimedRunner

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

SECONDS_PER_TOKEN = 1e-4
TIMEOUT_S = 1.0
CONFIG = EngineConfig(max_batch_tokens=1024, max_queue_tokens=10**6)


@pytest.fixture(scope="module")
def served():
    server = Server(ServerConfig(request_timeout=TIMEOUT_S))
    with TestClient(create_app(server.config, server)) as client:
        model = server.registry().models[0]
        real_engine = model.engine
        engine = Engine(
            TimedRunner(SECONDS_PER_TOKEN, 384), EngineConfig(max_batch_tokens=1024, max_queue_tokens=10**6)
        )
        engine.start()
        model.engine = engine
        try:
            yield client, engine, server
        finally:
            model.engine = real_engine
            engine.stop()


def body(num_texts: int) -> bytes:
    # "word" x 98 is 100 tokens with [CLS] and [SEP]
    return json.dumps({"input": [" ".join(["word"] * 98)] * num_texts}).encode()


async def post(app, route: str, payload: bytes) -> tuple[int, dict[bytes, bytes], float]:
    """One POST through the ASGI interface: (status, headers, seconds)."""
    messages = [{"type": "http.request", "body": payload, "more_body": False}]
    done = asyncio.Event()

    async def receive():
        if messages:
            return messages.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": route, "raw_path": route.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        "client": ("127.0.0.1", 40000), "server": ("posy", 80), "state": {},
    }  # fmt: skip
    started = time.perf_counter()
    await app(scope, receive, send)
    seconds = time.perf_counter() - started
    done.set()
    start = next(message for message in sent if message["type"] == "http.response.start")
    return start["status"], dict(start["headers"]), seconds


def test_a_burst_beyond_the_timeout_gets_only_200s_and_429s(served):
    client, engine, _ = served
    assert client.post("/v1/embeddings", content=body(10)).status_code == 200  # the engine measures
    assert engine.rate.seconds_per_token is not None

    async def burst():
        # 40 requests of 1,000 tokens at once: about 4 s of work against a 1 s timeout
        return await asyncio.gather(*(post(client.app, "/v1/embeddings", body(10)) for _ in range(40)))

    answers = client.blocking_portal.call(burst)
    statuses = [status for status, _, _ in answers]
    assert set(statuses) == {200, 429}, statuses
    # 0.45 to 0.9 s of work at the measured rate (its estimates stretched by up to twice, the margin)
    assert 3 <= statuses.count(200) <= 12
    assert all(int(headers[b"retry-after"]) >= 1 for status, headers, _ in answers if status == 429)
    assert max(seconds for status, _, seconds in answers if status == 200) < TIMEOUT_S


def test_a_request_that_cannot_finish_even_on_an_idle_server_is_refused_up_front(served):
    client, engine, _ = served
    client.post("/v1/embeddings", content=body(10))
    # 20 x 100 tokens: about 0.2 s; 200 x 100: about 2 s, over the 1 s timeout
    assert client.post("/v1/embeddings", content=body(20)).status_code == 200
    response = client.post("/v1/embeddings", content=body(200))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "input"
    assert "--request-timeout" in error["message"] and "idle server" in error["message"]
    tei = client.post("/embed", json={"inputs": [" ".join(["word"] * 98)] * 200})
    assert tei.status_code == 413 and tei.json()["error_type"] == "Validation"


def test_a_timeout_of_zero_lets_any_request_run(served, monkeypatch):
    client, engine, server = served
    monkeypatch.setattr(server, "config", dataclasses.replace(server.config, request_timeout=0))
    response = client.post("/v1/embeddings", content=body(200))  # about 2 s of work
    assert response.status_code == 200 and len(response.json()["data"]) == 200


def test_work_that_overruns_its_estimate_gets_its_504_at_the_timeout_never_a_late_200(served):
    client, engine, _ = served
    client.post("/v1/embeddings", content=body(10))  # measured at 0.1 ms a token
    engine.runner.seconds_per_token = 1.2e-3  # then the host slows the model twelve times
    try:
        # 1,000 tokens: 0.1 s as estimated, admitted; 1.2 s as run, past the 1 s timeout
        status, _, seconds = client.blocking_portal.call(post, client.app, "/v1/embeddings", body(10))
    finally:
        engine.runner.seconds_per_token = SECONDS_PER_TOKEN
    # at the timeout as the client's clock counts it: less the bytes' unread wait the gateway allows for
    # (its loop's lag, api/loop_lag.py), never after it
    assert status == 504 and TIMEOUT_S / 2 <= seconds < TIMEOUT_S + 0.15, (status, seconds)


def test_the_newcomers_sequence_ordinary_requests_are_answered_within_seconds_of_a_busy_spell(served):
    """Issue 57's lock: one oversized request ran while another process had the host (its batches measured
    the engine twenty times slower) and timed out; the queue emptied, and requests of ordinary size got a
    429 on every retry, for half an hour, because nothing admitted came to measure the quiet host again.
    Now the idle engine probes itself: every ordinary request is answered within a few seconds of the queue
    emptying, and none is refused for good."""
    client, _, server = served
    model = server.registry().models[0]
    runner = TimedRunner(SECONDS_PER_TOKEN, 384)
    engine = Engine(runner, CONFIG)
    engine.probe_batch = pack([[0] * 128])
    engine.probe()  # as build_engine seeds it: the engine's only measure so far, of the quiet host
    engine.start()
    served_engine, model.engine = model.engine, engine
    try:
        runner.seconds_per_token = 20 * SECONDS_PER_TOKEN  # another process takes the host
        # 1,000 tokens: 0.1 s as estimated, admitted; 2 s as run: a 504 at the timeout
        assert client.post("/v1/embeddings", content=body(10)).status_code == 504
        runner.seconds_per_token = SECONDS_PER_TOKEN  # the host is quiet again
        while engine.queued_tokens or engine.rate.busy_since is not None:
            time.sleep(0.01)
        emptied = time.monotonic()
        assert engine.rate.seconds_per_token > 10 * SECONDS_PER_TOKEN  # what the busy spell measured
        # 500 tokens: 0.05 s on the quiet host; 1.8 s, stretched, on the rate the busy spell left
        while (response := client.post("/v1/embeddings", content=body(5))).status_code == 429:
            time.sleep(int(response.headers["retry-after"]))
        assert response.status_code == 200, response.text
        assert time.monotonic() - emptied < 3.0
        for _ in range(5):
            assert client.post("/v1/embeddings", content=body(5)).status_code == 200
    finally:
        model.engine = served_engine
        engine.stop()


def test_a_probe_taken_during_a_flood_does_not_refuse_for_good_what_the_quiet_host_runs_in_time(served):
    """The flood's lock: the idle engine's probe ran while the host was still busy, agreed with the busy
    batches, and no later probe was due; a request that ran in 1.5 s before the flood got a 400 "on an idle
    server" on every try after it, and nothing admitted came to measure the quiet host. Now every rate
    recovers toward the quiet host's as its latest observation ages (RECOVERY_HALF_LIFE_S)."""
    client, _, server = served
    model = server.registry().models[0]
    runner = TimedRunner(SECONDS_PER_TOKEN, 384)
    engine = Engine(runner, CONFIG)
    engine.probe_batch = pack([[0] * 128])
    engine.probe()  # the quiet host, as build_engine seeds it
    engine.start()
    served_engine, model.engine = model.engine, engine
    try:
        runner.seconds_per_token = 5 * SECONDS_PER_TOKEN  # the flood's host
        for _ in range(3):
            assert client.post("/v1/embeddings", content=body(2)).status_code == 200
        deadline = time.monotonic() + PROBE_AFTER_S + 2.0
        while engine.rate.num_probes < 2:  # the idle engine probes the busy host, which agrees
            assert time.monotonic() < deadline
            time.sleep(0.01)
        runner.seconds_per_token = SECONDS_PER_TOKEN  # the flood is over
        assert not engine.rate.probe_due(time.perf_counter() + 100)  # and no probe will come
        # 2,000 tokens: 0.2 s on the quiet host (0.4 s stretched); 2 s stretched on the busy host's rate
        response = client.post("/v1/embeddings", content=body(20))
        assert response.status_code == 400 and "idle server" in response.text
        quiet = time.monotonic()
        while (response := client.post("/v1/embeddings", content=body(20))).status_code != 200:
            assert response.status_code in (400, 429), response.text
            assert time.monotonic() - quiet < 3 * RECOVERY_HALF_LIFE_S, response.text
            time.sleep(0.1)
        for _ in range(3):  # the quiet host's batches do not bring the busy spell's rate back
            assert client.post("/v1/embeddings", content=body(20)).status_code == 200
    finally:
        model.engine = served_engine
        engine.stop()
