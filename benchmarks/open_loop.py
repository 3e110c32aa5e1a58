"""run_open_loop(): requests sent at a fixed rate whatever the server answers (closed-loop clients can
never ask for more than the server gives), from several client processes, each an asyncio loop over
raw keep-alive HTTP/1.1 connections that it opens as it needs them. For overload: every answer's status,
its Retry-After and its latency."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np

from benchmarks.raw_http import request_bytes

START_DELAY_S = 1.0
ANSWER_TIMEOUT_S = 120.0
# a connection idle this long is not used again: uvicorn closes one idle for 5 s (its keep-alive timeout),
# and a request written as it closes gets no answer (HTTP clients drop such connections likewise)
IDLE_REUSE_S = 4.0


STAGES = ("tokenization", "queue", "inference")


@dataclass(frozen=True, slots=True)
class ServerTimes:
    """An answer's x-*-time headers (ms)."""

    total: float
    tokenization: float = 0.0
    queue: float = 0.0
    inference: float = 0.0


@dataclass(frozen=True, slots=True)
class OpenLoopResult:
    # (status, seconds, Retry-After, the server's timing headers); status 0: no answer, and why
    answers: list[tuple[int, float, str | None, ServerTimes | None]]
    offered_per_s: float

    def count(self, status: int) -> int:
        return sum(answer[0] == status for answer in self.answers)

    def latency_ms(self, status: int, percentile: float) -> float | None:
        seconds = [answer[1] for answer in self.answers if answer[0] == status]
        return 1000 * float(np.percentile(seconds, percentile)) if seconds else None

    def server_ms(self, status: int, percentile: float) -> float | None:
        """A percentile of the time the server says it took (x-total-time) for the answers of `status`."""
        times = [answer[3].total for answer in self.answers if answer[0] == status and answer[3] is not None]
        return float(np.percentile(times, percentile)) if times else None

    def slowest_stages_ms(self, status: int, share: float) -> dict[str, float]:
        """The server's stages (ms, means) over the slowest `share` of the answers of `status` by its own
        total, the time outside the three stages as "other": where the tail's time went."""
        times = sorted(
            (answer[3] for answer in self.answers if answer[0] == status and answer[3] is not None),
            key=lambda times: times.total,
        )
        tail = times[int(len(times) * (1 - share)) :]
        if not tail:
            return {}
        means = {stage: float(np.mean([getattr(times, stage) for times in tail])) for stage in STAGES}
        means["other"] = float(np.mean([times.total for times in tail])) - sum(means.values())
        return means

    @property
    def statuses(self) -> set[int]:
        return {answer[0] for answer in self.answers}

    @property
    def failures(self) -> list[str]:
        """Why requests got no answer, as the client saw it."""
        return [str(why) for status, _, why, _ in self.answers if status == 0]

    @property
    def num_429_without_retry_after(self) -> int:
        return sum(status == 429 and not retry for status, _, retry, _ in self.answers)


def run_open_loop(
    url: str, bodies: list[bytes], rate_per_s: float, duration_s: float, num_processes: int = 4,
    path: str = "/v1/embeddings",
) -> OpenLoopResult:  # fmt: skip
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    start_at = time.time() + START_DELAY_S + 2.0  # spawned interpreters need a moment
    processes = [
        context.Process(
            target=_sender,
            args=(url, path, bodies, rate_per_s / num_processes, duration_s, start_at, index, results),
            daemon=True,
        )
        for index in range(num_processes)
    ]
    for process in processes:
        process.start()
    answers: list = []
    try:
        for _ in processes:
            answers += results.get(timeout=START_DELAY_S + 2.0 + duration_s + ANSWER_TIMEOUT_S + 30)
    except queue.Empty:
        raise RuntimeError("an open-loop sender did not report in time") from None
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
    return OpenLoopResult(answers, rate_per_s)


def _sender(url, path, bodies, rate_per_s, duration_s, start_at, seed, results) -> None:
    results.put(asyncio.run(_send_all(url, path, bodies, rate_per_s, duration_s, start_at, seed)))


async def _send_all(url, path, bodies, rate_per_s, duration_s, start_at, seed):
    address = urlsplit(url)
    requests = [request_bytes("POST", path, body) for body in bodies]
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []  # with when it was idle
    answers: list[tuple[int, float, str | None, ServerTimes | None]] = []

    async def one(request: bytes) -> None:
        started = time.perf_counter()
        try:
            while idle and idle[0][2] < started - IDLE_REUSE_S:  # the oldest at the bottom
                idle.pop(0)[1].close()
            if idle:
                reader, writer, _ = idle.pop()
            else:
                reader, writer = await asyncio.open_connection(address.hostname, address.port)
            writer.write(request)
            status, retry, times = await asyncio.wait_for(_response(reader), ANSWER_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as error:
            # no answer: the status is 0 and the third field says why
            answers.append((0, time.perf_counter() - started, f"{type(error).__name__}: {error}"[:200], None))
            return
        answers.append((status, time.perf_counter() - started, retry, times))
        idle.append((reader, writer, time.perf_counter()))

    await asyncio.sleep(max(0.0, start_at - time.time()))
    interval = 1.0 / rate_per_s
    began = time.perf_counter()
    tasks = []
    index = seed  # the processes start on different bodies
    while (due := began + len(tasks) * interval) < began + duration_s:
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one(requests[index % len(requests)])))
        index += 1
    await asyncio.gather(*tasks)
    return answers


async def _response(reader: asyncio.StreamReader) -> tuple[int, str | None, ServerTimes | None]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    lines = head.split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    await reader.readexactly(int(headers.get("content-length", "0")))
    total = headers.get("x-total-time")
    if total is None:
        return status, headers.get("retry-after"), None
    stages = {stage: float(headers.get(f"x-{stage}-time", "0")) for stage in STAGES}
    return status, headers.get("retry-after"), ServerTimes(float(total), **stages)
