"""The HTTP suites' client side: run_clients() drives a live server from separate client processes (one
request in flight each, back to back, all starting on one instant) over raw keep-alive HTTP/1.1, which
costs next to nothing, or through httpx ("a Python SDK client"); it keeps the server's timing headers of
every request. embed_over_http() for parity checks."""

from __future__ import annotations

import base64
import multiprocessing
import queue
import threading
import time
from dataclasses import dataclass

import msgspec
import numpy as np

from benchmarks.raw_http import RawConnection, request_bytes

EMBEDDINGS_PATH = "/v1/embeddings"
REQUEST_TIMEOUT_S = 60.0  # a request that takes longer is an error, so that nothing hangs
READY_TIMEOUT_S = 60.0  # for the client processes to start (spawned interpreters import httpx)
START_DELAY_S = 0.2  # after the last client is ready, so that every client starts on the same instant
# the server's timing headers (text-embeddings-inference's), milliseconds
STAGE_HEADERS = {
    "total": "x-total-time", "tokenization": "x-tokenization-time", "queue": "x-queue-time",
    "inference": "x-inference-time",
}  # fmt: skip


class _Usage(msgspec.Struct):
    prompt_tokens: int


class _Reply(msgspec.Struct):  # the rest of the reply is skipped, not decoded
    usage: _Usage | None = None  # (a rerank's has none)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """The requests started inside the timed window (after the warm-up), over every client."""

    latencies_s: list[float]  # successful requests: the client's wall time of the POST, body read
    num_tokens: int  # sum of their usage.prompt_tokens
    errors: list[str]  # one line per failed request: "HTTP 429: ..." or the transport error
    # throughput_window's: from a response at the timed window's start to the last one, and the successful
    # responses within it, warm-up requests' included, and their tokens
    wall_s: float
    num_completed: int
    completed_tokens: int
    stages_ms: dict[str, list[float]]  # successful requests: the server's timing headers, by stage

    @property
    def num_requests(self) -> int:
        return len(self.latencies_s)

    @property
    def requests_per_s(self) -> float:
        return self.num_completed / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.completed_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def latency_ms(self, percentile: float) -> float:
        return 1000 * float(np.percentile(self.latencies_s, percentile)) if self.latencies_s else 0.0

    @classmethod
    def joined(cls, results: list[LoadResult]) -> LoadResult:
        """Several windows of one case as one."""
        stages: dict[str, list[float]] = {}
        for result in results:
            for stage, values in result.stages_ms.items():
                stages.setdefault(stage, []).extend(values)
        return cls(
            [latency for result in results for latency in result.latencies_s],
            sum(result.num_tokens for result in results),
            [error for result in results for error in result.errors],
            sum(result.wall_s for result in results),
            sum(result.num_completed for result in results),
            sum(result.completed_tokens for result in results),
            stages,
        )

    def stage_ms(self, stage: str, percentile: float = 50) -> float | None:
        """A percentile of what the server said a stage took; None where it said nothing."""
        values = self.stages_ms.get(stage)
        return float(np.percentile(values, percentile)) if values else None


def run_clients(
    url: str,
    bodies_per_client: list[list[bytes]],
    *,
    duration_s: float | None = None,
    num_requests: int | None = None,
    warmup_s: float = 0.0,
    timeout_s: float = REQUEST_TIMEOUT_S,
    path: str = EMBEDDINGS_PATH,
    client: str = "raw",
) -> LoadResult:
    """One process per entry of `bodies_per_client`, each POSTing its pre-built JSON bodies (cycled) back
    to back: for `warmup_s` untimed, then for `duration_s` or `num_requests` requests each. `client`:
    "raw" (keep-alive HTTP/1.1 on a socket) or "httpx"."""
    if (duration_s is None) == (num_requests is None):
        raise ValueError("give exactly one of duration_s and num_requests")
    context = multiprocessing.get_context("spawn")  # no fork of a parent that holds CUDA
    ready = context.Barrier(len(bodies_per_client) + 1)
    go = context.Event()
    start_at = context.Value("d", 0.0)
    results = context.Queue()
    plan = (warmup_s, duration_s, num_requests, timeout_s, client)
    processes = [
        context.Process(
            target=_client, args=(url + path, bodies, plan, ready, go, start_at, results), daemon=True
        )
        for bodies in bodies_per_client
    ]
    for process in processes:
        process.start()
    try:
        try:
            ready.wait(READY_TIMEOUT_S)
        except threading.BrokenBarrierError as error:
            raise RuntimeError(f"the load clients did not start within {READY_TIMEOUT_S:.0f} s") from error
        start_at.value = time.monotonic() + START_DELAY_S
        go.set()
        # each client stops starting requests at the window's end and finishes the one in flight
        longest_s = warmup_s + (duration_s if duration_s is not None else num_requests * timeout_s)
        samples = _collect(results, processes, START_DELAY_S + longest_s + timeout_s + READY_TIMEOUT_S)
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
    window_start = start_at.value + warmup_s
    timed = [sample for sample in samples if sample[0] >= window_start]
    latencies = [end - start for start, end, _, error, _ in timed if error is None]
    num_tokens = sum(tokens for _, _, tokens, error, _ in timed if error is None)
    errors = [error for _, _, _, error, _ in timed if error is not None]
    stages: dict[str, list[float]] = {}
    for *_, error, stage_ms in timed:
        for stage, value in (stage_ms or {}).items():
            if error is None:
                stages.setdefault(stage, []).append(value)
    done = sorted((end, tokens) for _, end, tokens, error, _ in samples if error is None)
    wall_s, num_completed, completed_tokens = throughput_window(done, window_start, timed)
    return LoadResult(latencies, num_tokens, errors, wall_s, num_completed, completed_tokens, stages)


def throughput_window(
    done: list[tuple[float, int]], window_start: float, timed: list[tuple]
) -> tuple[float, int, int]:
    """(seconds, responses, tokens) of the throughput window: from the first response at or after the timed
    window's start to the last response, and the responses within it, warm-up requests' included. Counting
    only the requests started in the timed window against the time since the first of them started would
    charge the window with the work of the warm-up's requests still in flight: with 4 clients of 100 x
    4,096-token requests, which take seconds each, that undercounted the server's rate by a fifth or more.
    Between two responses the server did the work of the later ones (whose clients keep the queue full).
    With fewer than two responses in the window: the timed requests from the first one's start."""
    ends = [end for end, _ in done]
    first = next((index for index, end in enumerate(ends) if end >= window_start), len(ends))
    if len(ends) - first >= 2:
        within = done[first + 1 :]
        return ends[-1] - ends[first], len(within), sum(tokens for _, tokens in within)
    good = [(start, end, tokens) for start, end, tokens, error, _ in timed if error is None]
    if not good:
        return 0.0, 0, 0
    first_start = min(start for start, _, _ in good)
    return max(end for _, end, _ in good) - first_start, len(good), sum(tokens for *_, tokens in good)


def _collect(results, processes, timeout_s: float) -> list[tuple]:
    """Every client's samples; a client that dies or overruns fails the run instead of hanging it."""
    samples: list[tuple] = []
    deadline = time.monotonic() + timeout_s
    for _ in processes:
        while True:
            try:
                samples.extend(results.get(timeout=1.0))
                break
            except queue.Empty:
                dead = [process.exitcode for process in processes if process.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    message = f"load clients failed (exit codes {dead}) or overran {timeout_s:.0f} s"
                    raise RuntimeError(message) from None
    return samples


def _client(url, bodies, plan, ready, go, start_at, results) -> None:
    """A client process: one connection, one request in flight; it sends (start, end, tokens, error,
    stage milliseconds) for each request, the warm-up's included."""
    warmup_s, duration_s, num_requests, timeout_s, kind = plan
    usage = msgspec.json.Decoder(_Reply)
    samples = []
    post = _raw_poster(url, bodies, timeout_s) if kind == "raw" else _httpx_poster(url, bodies, timeout_s)
    ready.wait(READY_TIMEOUT_S)
    go.wait(READY_TIMEOUT_S)
    window_start = start_at.value + warmup_s
    deadline = window_start + duration_s if duration_s is not None else float("inf")
    time.sleep(max(0.0, start_at.value - time.monotonic()))
    max_samples = num_requests if num_requests is not None else float("inf")
    index = 0
    while (started := time.monotonic()) < deadline and len(samples) < max_samples:
        tokens, error, stages = 0, None, None
        try:
            status, headers, content = post(index % len(bodies))
            ended = time.monotonic()
            if status == 200:
                reply_usage = usage.decode(content).usage
                tokens = reply_usage.prompt_tokens if reply_usage is not None else 0
                stages = {
                    stage: float(headers[name]) for stage, name in STAGE_HEADERS.items() if name in headers
                }
            else:
                error = f"HTTP {status}: {content[:200].decode(errors='replace')}"
        except (OSError, ValueError, msgspec.DecodeError) as failure:  # httpx's errors are OSErrors here
            ended = time.monotonic()
            error = f"{type(failure).__name__}: {failure}"
        index += 1
        # the warm-up's too: their responses within the timed window count to its throughput
        samples.append((started, ended, tokens, error, stages))
    results.put(samples)


def _raw_poster(url: str, bodies: list[bytes], timeout_s: float):
    from urllib.parse import urlsplit

    address = urlsplit(url)
    connection = RawConnection(url, timeout_s)
    requests = [request_bytes("POST", address.path, body) for body in bodies]

    def post(index: int) -> tuple[int, dict[str, str], bytes]:
        response = connection.send(requests[index])
        return response.status, response.headers, response.body

    return post


def _httpx_poster(url: str, bodies: list[bytes], timeout_s: float):
    import httpx

    client = httpx.Client(timeout=timeout_s, trust_env=False, headers={"content-type": "application/json"})

    def post(index: int) -> tuple[int, dict[str, str], bytes]:
        try:
            response = client.post(url, content=bodies[index])
        except httpx.HTTPError as error:
            raise OSError(str(error)) from error
        return response.status_code, dict(response.headers), response.content

    return post


def embed_over_http(url: str, texts: list[str], model: str, one_per_request: bool = False):
    """(vectors [n, dim] float32, usage.prompt_tokens summed) for `texts`, sent in one request or one text
    a request, base64-encoded as the timed requests ask for them."""
    import httpx

    vectors, num_tokens = [], 0
    batches = [[text] for text in texts] if one_per_request else [texts]
    with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
        for batch in batches:
            response = client.post(
                url + EMBEDDINGS_PATH, json={"model": model, "input": batch, "encoding_format": "base64"}
            )
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:500]}")
            reply = response.json()
            num_tokens += reply["usage"]["prompt_tokens"]
            for item in sorted(reply["data"], key=lambda item: item["index"]):
                vectors.append(np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4"))
    return np.stack(vectors), num_tokens
