"""SIGTERM under load on a live `python -m api serve`, in one process and with two gateway processes over
two engine replicas: /ready turns 503 at once and new work gets 503 during the grace period, the admitted
request finishes with all its vectors, and the server exits 0 within the grace period plus the shutdown
timeout, leaving no process behind; and no request a client sent as the port closed is lost to a reset.
"""

import collections
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from benchmarks.gateway import children

from .conftest import REPO_ROOT, free_port, server_env

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

GRACE_S = 3.0
SHUTDOWN_TIMEOUT_S = 60.0
CLIENTS = 8  # of each kind: keeping connections alive, and a new connection per request


def wait_ready(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited while starting"
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not become ready")


def batches_run(url: str) -> float:
    """Engine batches the server has run, over every gateway and replica (its /metrics)."""
    lines = httpx.get(f"{url}/metrics", timeout=5).text.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith("posy_batch_tokens_count"))


@pytest.mark.parametrize(
    "flags",
    [("--engine-process", "off"), ("--api-workers", "2", "--replicas", "2")],
    ids=["one-process", "two-gateways"],
)
def test_sigterm_drains_admitted_work_and_exits_zero(tmp_path, flags):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "api", "serve", "--port", str(port), "--device", "cpu",
        "--drain-grace", str(GRACE_S), "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S), *flags,
    ]  # fmt: skip
    log = (tmp_path / "server.log").open("wb")
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=server_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(url, process)
        helpers = children(process.pid)
        texts = [f"admitted text {index} " + "about cats and dogs " * 20 for index in range(300)]
        admitted: dict = {}

        def send() -> None:
            response = httpx.post(f"{url}/v1/embeddings", json={"input": texts}, timeout=120)
            admitted["status"], admitted["body"] = response.status_code, response.json()

        batches_before = batches_run(url)
        sender = threading.Thread(target=send)
        sender.start()
        # admitted once the engine has run a batch of it: about 39k tokens take the CPU engine 5 to 7 s on 2
        # cores, in about ten batches (a fixed second was not always enough for a loaded host's gateway)
        deadline = time.monotonic() + 30
        while batches_run(url) == batches_before and "status" not in admitted:
            assert time.monotonic() < deadline, "the engine ran no batch of the admitted request"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert "status" not in admitted, "the admitted request must still run when the signal comes"
        time.sleep(0.3)
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # alive while draining
        assert httpx.get(f"{url}/ready", timeout=5).status_code == 503
        refused = httpx.post(f"{url}/v1/embeddings", json={"input": "too late"}, timeout=5)
        assert refused.status_code == 503 and "error" in refused.json()
        assert time.monotonic() - signalled < GRACE_S, "the checks above must run inside the grace period"
        sender.join(SHUTDOWN_TIMEOUT_S + GRACE_S)
        assert admitted.get("status") == 200, admitted
        assert len(admitted["body"]["data"]) == len(texts)
        assert process.wait(timeout=SHUTDOWN_TIMEOUT_S + GRACE_S + 10) == 0
        deadline = time.monotonic() + 10  # multiprocessing's resource tracker follows its parent shortly
        while [pid for pid in helpers if alive(pid)]:
            assert time.monotonic() < deadline, "a gateway or replica process outlived the server"
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


@pytest.mark.parametrize(
    "flags",
    [("--engine-process", "off"), ("--api-workers", "2", "--replicas", "2")],
    ids=["one-process", "two-gateways"],
)
def test_requests_sent_as_the_port_closes_are_answered_not_reset(tmp_path, flags):
    """Clients keep sending through the drain and the close: each request they sent gets an answer (a
    200, or a 503 with Retry-After that closes its connection); the only failure is a refused connect,
    which sent nothing."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "api", "serve", "--port", str(port), "--device", "cpu",
        "--drain-grace", "1", *flags,
    ]  # fmt: skip
    log = (tmp_path / "server.log").open("wb")
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=server_env(), stdout=log, stderr=subprocess.STDOUT)
    outcomes: collections.Counter = collections.Counter()
    stop = threading.Event()

    def client(keep_alive: bool) -> None:
        limits = httpx.Limits(max_keepalive_connections=1 if keep_alive else 0)
        with httpx.Client(base_url=url, timeout=30, limits=limits, trust_env=False) as http:
            while not stop.is_set():
                try:
                    response = http.post("/v1/embeddings", json={"input": ["a short text"] * 4})
                    headers = response.headers
                    outcomes[response.status_code, headers.get("retry-after"), headers.get("connection")] += 1
                except httpx.ConnectError:
                    # nothing was sent: the port refused it, or reset it from the backlog of a listening
                    # socket that closed under it (errno 104, as the kernel does at close)
                    outcomes["refused"] += 1
                    time.sleep(0.02)
                except httpx.TransportError as error:
                    outcomes[repr(error)] += 1

    try:
        wait_ready(url, process)
        clients = [threading.Thread(target=client, args=(index % 2 == 0,)) for index in range(2 * CLIENTS)]
        for thread in clients:
            thread.start()
        time.sleep(1.0)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=SHUTDOWN_TIMEOUT_S) == 0
        time.sleep(0.5)  # clients now meet a closed port
        stop.set()
        for thread in clients:
            thread.join(30)
    finally:
        stop.set()
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    expected = {(200, None, None), (503, "1", "close"), "refused"}
    assert set(outcomes) <= expected, outcomes
    assert all(outcomes[key] for key in expected), outcomes


def test_a_connection_opened_as_the_port_closes_is_answered_though_its_request_comes_late(tmp_path):
    """A client that connected before the close but sends its request a second later (a loaded host's
    client) gets its 503, not a closed connection."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "api",
        "serve",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--drain-grace",
        "1",
    ]
    log = (tmp_path / "server.log").open("wb")
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=server_env(), stdout=log, stderr=subprocess.STDOUT)
    body = b'{"input": "late"}'
    request = b"POST /v1/embeddings HTTP/1.1\r\nHost: posy\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    try:
        wait_ready(url, process)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.8)  # inside the grace period: the listener takes the connections
        connections = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        time.sleep(1.2)  # the port has closed meanwhile
        answers = []
        for sock in connections:
            with sock:
                sock.sendall(request)
                sock.settimeout(10)
                answers.append(sock.recv(64).split(b"\r\n")[0])
        assert answers == [b"HTTP/1.1 503 Service Unavailable"] * 4
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


def alive(pid: int) -> bool:
    """Running (an exited process waiting for its new parent to reap it does not count)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
