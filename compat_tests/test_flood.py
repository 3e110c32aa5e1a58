"""A flood of clients that never back off, against a live server with --request-timeout, while another
process loads every core (issues 38 and 57): each request is answered within the timeout (200) or refused
with a Retry-After (429) within it too; none is answered late at the client, none gets a 504, no connection
is dropped, and the server serves normally once the flood ends. Lateness at the client is judged on the
test's own clock, less what its own event loop lagged meanwhile (it shares the cores too): the server answers
for the time from the request's first byte sent to its answer's last byte, not for a client that reads
late."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import pytest

from .contract import MODEL

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

TIMEOUT_S = 5.0
NUM_CLIENTS = 64
DURATION_S = 12.0
TEXTS_A_REQUEST = 32
BEAT_S = 0.02  # the client loop's heartbeat
READ_WINDOW_S = 0.25
WORDS = (
    "the quick brown fox jumps over a lazy dog while seven cats watch from the warm kitchen window as rain "
    "falls on the old stone bridge"
).split()
# another process's work on every core: a busy loop a core, for the flood's length
LOAD = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int | str  # a transport error's name where the connection broke
    sent: float  # time.monotonic() when the request's first byte was written
    seconds: float  # from then to its answer's last byte read
    total_ms: float | None  # the server's x-total-time
    retry_after: str | None


class ClientLag:
    """How late the test's own loop ran its heartbeat: (time, lag) samples."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []

    async def beat(self, stop_at: float) -> None:
        while (due := time.monotonic() + BEAT_S) < stop_at + TIMEOUT_S:
            await asyncio.sleep(BEAT_S)
            now = time.monotonic()
            self.samples.append((now, max(0.0, now - due)))

    def around(self, moment: float) -> float:
        """The worst lag of the beats within READ_WINDOW_S of `moment`: how late the loop may have read an
        answer that it saw complete then."""
        return max((lag for at, lag in self.samples if abs(at - moment) <= READ_WINDOW_S), default=0.0)


def bodies(seed: int):
    """Requests of TEXTS_A_REQUEST texts of 8 to 40 words, each different."""
    rng = random.Random(seed)
    while True:
        texts = [" ".join(rng.choices(WORDS, k=rng.randint(8, 40))) for _ in range(TEXTS_A_REQUEST)]
        body = json.dumps({"model": MODEL, "input": texts}).encode()
        head = "POST /v1/embeddings HTTP/1.1\r\nHost: posy\r\nContent-Type: application/json\r\n"
        yield f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *lines = head.rstrip("\r\n").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines)
    headers = {name.lower(): value for name, value in headers.items()}
    await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers


async def never_backs_off(host: str, port: int, seed: int, stop_at: float, answers: list[Answer]) -> None:
    """One client: a request the moment the last is answered, whatever the answer, until stop_at."""
    requests = bodies(seed)
    reader = writer = None
    try:
        while time.monotonic() < stop_at:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            started = time.monotonic()
            try:
                writer.write(next(requests))
                status, headers = await read_answer(reader)
            except (ConnectionError, asyncio.IncompleteReadError) as error:
                answers.append(Answer(type(error).__name__, started, time.monotonic() - started, None, None))
                writer.close()
                writer = None
                continue
            total = headers.get("x-total-time")
            answers.append(
                Answer(
                    status,
                    started,
                    time.monotonic() - started,
                    float(total) if total is not None else None,
                    headers.get("retry-after"),
                )
            )
            if headers.get("connection") == "close":
                writer.close()
                writer = None
    finally:
        if writer is not None:
            writer.close()


def flood(url: str) -> tuple[list[Answer], ClientLag]:
    address = urlsplit(url)
    answers: list[Answer] = []
    lag = ClientLag()

    async def main() -> None:
        stop_at = time.monotonic() + DURATION_S
        beating = asyncio.ensure_future(lag.beat(stop_at))
        await asyncio.gather(
            *(
                never_backs_off(address.hostname, address.port, seed, stop_at, answers)
                for seed in range(NUM_CLIENTS)
            )
        )
        beating.cancel()

    asyncio.run(main())
    return answers, lag


def load_every_core(seconds: float) -> list[subprocess.Popen]:
    code = LOAD.format(seconds=seconds)
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]


@pytest.mark.parametrize("layout", [(), ("--engine-process", "on")], ids=["default", "engine-process"])
def test_a_flood_of_clients_that_never_back_off_on_a_loaded_host_gets_answers_in_time_or_refusals(
    server_factory, layout
):
    server = server_factory("--request-timeout", f"{TIMEOUT_S:g}", *layout)
    load = load_every_core(DURATION_S + TIMEOUT_S)
    try:
        answers, lag = flood(server.url)
    finally:
        for process in load:
            process.kill()
            process.wait()
    statuses = collections.Counter(answer.status for answer in answers)
    served = [answer for answer in answers if answer.status == 200]
    summary = f"statuses {dict(statuses)}"
    assert set(statuses) <= {200, 429}, f"{summary}\n{server.log_tail()}"  # no 504, no dropped connection
    assert len(served) >= 10, summary  # the server kept serving through the flood
    assert all(int(answer.retry_after) >= 1 for answer in answers if answer.status == 429), summary
    late = [answer for answer in served if answer.total_ms >= 1000 * TIMEOUT_S]
    assert not late, f"{len(late)} answered after the timeout by the server's clock: {late[:5]}; {summary}"
    late = [
        answer for answer in served if answer.seconds - lag.around(answer.sent + answer.seconds) >= TIMEOUT_S
    ]
    assert not late, f"{len(late)} answered after the timeout by the client's clock: {late[:5]}; {summary}"
    # a refusal is an answer too: one that comes after the timeout is no use to its client (refused before
    # their tokenization, a flood's refusals cost the loop little)
    refused = [
        answer.seconds - lag.around(answer.sent + answer.seconds)
        for answer in answers
        if answer.status == 429
    ]
    assert max(refused, default=0.0) < TIMEOUT_S, f"a 429 after {max(refused):.2f} s; {summary}"
    with httpx.Client(base_url=server.url, timeout=30, trust_env=False) as http:
        deadline = time.monotonic() + 2 * TIMEOUT_S  # the flood's admitted work drains first
        while (
            response := http.post("/v1/embeddings", json={"model": MODEL, "input": "after"})
        ).status_code == 429:
            assert time.monotonic() < deadline, response.text
            time.sleep(float(response.headers["retry-after"]))
        assert response.status_code == 200, response.text
