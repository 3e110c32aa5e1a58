"""Stalled clients on a live server (api/connection_limits.py): a request's head and body each have a
deadline, after which it gets a 408 and its connection closes, however slowly its bytes keep coming; a
thousand stalled connections leave other requests their usual latency; past --max-connections a new
connection gets a 503 with Retry-After, and once the stalled ones go the server takes new ones again."""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from .conftest import LiveServer, ServerFactory
from .contract import MODEL, assert_cohere_error, assert_openai_error

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 3.0
DEADLINES = ("--header-timeout", str(HEADER_TIMEOUT_S), "--body-timeout", str(BODY_TIMEOUT_S))
# a deadline is answered within this of its time (a timer on a 2-core host that other tests share)
SLACK_S = 1.5
NORMAL_LATENCY_S = 2.0  # a one-text embedding takes some 20 ms on a development core
NUM_STALLED = 1000
FD_RESERVE = 256  # the test process's own files and sockets beside the stalled ones
MAX_CONNECTIONS = 20
EMBEDDING = json.dumps({"model": MODEL, "input": "a normal request"}).encode()


def head(path: str, content_length: int | None = None) -> bytes:
    length = f"Content-Length: {content_length}\r\n" if content_length is not None else ""
    return f"POST {path} HTTP/1.1\r\nHost: posy\r\nContent-Type: application/json\r\n{length}\r\n".encode()


def connect(server: LiveServer) -> socket.socket:
    address = urlsplit(server.url)
    return socket.create_connection((address.hostname, address.port))


def read_response(sock: socket.socket, timeout_s: float) -> tuple[httpx.Response | None, float]:
    """The server's next response (None: it closed the connection without one) and the seconds it took;
    fails if none has come after `timeout_s`."""
    start = time.monotonic()
    sock.settimeout(timeout_s)
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        if not chunk:
            assert not received, f"the connection closed inside a response's head: {received!r}"
            return None, time.monotonic() - start
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    headers = [tuple(line.split(b": ", 1)) for line in lines]
    response = httpx.Response(int(status_line.split()[1]), headers=headers)
    while len(body) < int(response.headers["content-length"]):
        body += sock.recv(65536)
    elapsed = time.monotonic() - start
    return httpx.Response(response.status_code, headers=headers, content=body), elapsed


def closes(sock: socket.socket, timeout_s: float) -> bool:
    """The server closes the connection within `timeout_s`, sending nothing more."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def is_open(sock: socket.socket) -> bool:
    """Open, and nothing sent by the server (no answer, no close)."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except ConnectionError:
        return False
    return False


def embed_within(http: httpx.Client, seconds: float) -> None:
    start = time.monotonic()
    response = http.post("/v1/embeddings", content=EMBEDDING, headers={"content-type": "application/json"})
    elapsed = time.monotonic() - start
    assert response.status_code == 200, response.text
    assert elapsed < seconds, f"a normal request took {elapsed:.2f} s"


@pytest.fixture(scope="module")
def deadlines(server_factory: ServerFactory) -> LiveServer:
    return server_factory(*DEADLINES)


def test_a_stalled_body_gets_a_408_at_its_deadline_and_the_connection_closes(deadlines):
    with connect(deadlines) as sock:
        sock.sendall(head("/v1/embeddings", 100) + b'{"in')
        response, elapsed = read_response(sock, BODY_TIMEOUT_S + SLACK_S + 5)
        assert response is not None and closes(sock, SLACK_S)
    assert BODY_TIMEOUT_S - 0.1 < elapsed < BODY_TIMEOUT_S + SLACK_S, elapsed
    error = assert_openai_error(response, 408)
    assert "--body-timeout" in error["message"] and error["type"] == "timeout"
    assert response.headers["connection"] == "close" and response.headers["x-request-id"]
    with httpx.Client(base_url=deadlines.url, trust_env=False) as http:
        metrics = http.get("/metrics").text
    assert 'posy_requests_total{route="/v1/embeddings",status="408"}' in metrics  # not a 499


def test_a_trickled_body_gets_a_408_at_its_deadline_however_steadily_it_comes(deadlines):
    with connect(deadlines) as sock:
        sock.sendall(head("/v2/rerank", 10_000))
        start = time.monotonic()
        while is_open(sock) and time.monotonic() - start < BODY_TIMEOUT_S + SLACK_S:
            sock.sendall(b" ")  # a byte every 0.1 s: never idle for long
            time.sleep(0.1)
        response, _ = read_response(sock, SLACK_S)
        elapsed = time.monotonic() - start
    assert response is not None and BODY_TIMEOUT_S - 0.1 < elapsed < BODY_TIMEOUT_S + SLACK_S, elapsed
    assert "--body-timeout" in assert_cohere_error(response, 408)


def test_a_slow_body_that_arrives_within_its_deadline_is_answered(deadlines):
    with connect(deadlines) as sock:
        sock.sendall(head("/v1/embeddings", len(EMBEDDING)))
        step = len(EMBEDDING) // 5 + 1
        for start in range(0, len(EMBEDDING), step):  # five parts over a third of the deadline
            time.sleep(BODY_TIMEOUT_S / 15)
            sock.sendall(EMBEDDING[start : start + step])
        response, _ = read_response(sock, 10)
    assert response is not None and response.status_code == 200, response and response.text
    assert len(response.json()["data"][0]["embedding"]) == 384


def test_a_stalled_head_gets_a_408_and_a_silent_connection_is_closed_at_the_header_deadline(deadlines):
    with connect(deadlines) as partial, connect(deadlines) as silent:
        partial.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: po")
        response, elapsed = read_response(partial, HEADER_TIMEOUT_S + SLACK_S + 5)
        assert response is not None and elapsed < HEADER_TIMEOUT_S + SLACK_S, elapsed
        assert "--header-timeout" in assert_openai_error(response, 408)["message"]
        assert closes(partial, SLACK_S)
        # a connection that sent nothing has no request to answer: it is closed (by now: both were opened
        # at once)
        assert closes(silent, SLACK_S)


def test_the_next_head_on_a_kept_alive_connection_has_its_deadline_from_its_first_byte(deadlines):
    with connect(deadlines) as sock:
        sock.sendall(head("/v1/embeddings", len(EMBEDDING)) + EMBEDDING)
        response, _ = read_response(sock, 10)
        assert response is not None and response.status_code == 200, response and response.text
        time.sleep(HEADER_TIMEOUT_S + 0.2)  # idle, under uvicorn's 5 s keep-alive: not the head's time
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        response, elapsed = read_response(sock, HEADER_TIMEOUT_S + SLACK_S + 5)
    assert response is not None and response.status_code == 408, response and response.text
    assert HEADER_TIMEOUT_S - 0.1 < elapsed < HEADER_TIMEOUT_S + SLACK_S, elapsed


@pytest.fixture(scope="module")
def num_stalled() -> Iterator[int]:
    """NUM_STALLED, or as many as the open-file limit lets this process and the server hold: the soft limit
    is raised to that (the server, started after, inherits it) and put back after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = NUM_STALLED + FD_RESERVE
    if hard != resource.RLIM_INFINITY and hard < wanted:
        wanted = hard  # fewer stalled connections than asked: the hard limit cannot be raised here
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield min(NUM_STALLED, wanted - FD_RESERVE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_thousand_stalled_connections_leave_normal_requests_their_latency(server_factory, num_stalled):
    # deadlines past the test's length: the stalled connections stay open throughout
    server = server_factory("--header-timeout", "60", "--body-timeout", "60", "--max-connections", "1100")
    stalled = []
    try:
        for index in range(num_stalled):
            sock = connect(server)
            if index % 2:
                sock.sendall(head("/v1/embeddings", 100) + b'{"in')  # a stalled body
            else:
                sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: po")  # a stalled head
            stalled.append(sock)
        with httpx.Client(base_url=server.url, timeout=10, trust_env=False) as http:
            for _ in range(5):
                embed_within(http, NORMAL_LATENCY_S)
        assert all(is_open(sock) for sock in stalled)
    finally:
        for sock in stalled:
            sock.close()


def test_past_the_connection_cap_new_connections_get_a_503_until_the_stalled_ones_go(server_factory):
    server = server_factory("--max-connections", str(MAX_CONNECTIONS))
    stalled = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in stalled:
            sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: po")
        time.sleep(0.2)  # the server has accepted them
        with httpx.Client(base_url=server.url, timeout=10, trust_env=False) as http:
            refused = http.post("/v1/embeddings", content=EMBEDDING)
            assert "--max-connections" in assert_openai_error(refused, 503)["message"]
            assert refused.headers["retry-after"] == "1" and refused.headers["connection"] == "close"
            rerank = http.post("/v2/rerank", json={"model": MODEL, "query": "q", "documents": ["d"]})
            assert_cohere_error(rerank, 503)
            assert all(is_open(sock) for sock in stalled)
    finally:
        for sock in stalled:
            sock.close()
    with httpx.Client(base_url=server.url, timeout=10, trust_env=False) as http:
        deadline = time.monotonic() + 5
        while (response := http.post("/v1/embeddings", content=EMBEDDING)).status_code == 503:
            assert time.monotonic() < deadline, "still refusing after the stalled connections closed"
            time.sleep(0.05)
        assert response.status_code == 200, response.text
        embed_within(http, NORMAL_LATENCY_S)
