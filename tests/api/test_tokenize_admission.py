"""Tokenization inside admission: a large input whose tokenization (its wait behind what is queued on the
encoder's threads, at their measured rate, and its own time) and the engine's work could not finish
within --request-timeout is refused up front (429 with Retry-After, before it waits); an admitted one
whose part would start too late on a thread is refused then, never tokenized, rather than answered late.
Through the HTTP API: a burst of large inputs against a slow stand-in tokenizer gets 200s inside the
timeout and 429s that never reached the threads."""

import asyncio
import threading
import time

import numpy as np
import pytest
from litestar.testing import TestClient

from api.app import create_app
from api.config import ServerConfig
from api.guard import RequestGuard
from api.server import Server
from api.tokenize import INLINE_TOKENIZE_CHARS
from api.tokenizer_pool import RECOVERY_HALF_LIFE_S, StartBy, TokenizerBehind, TokenizerPool
from engine.admission import ADMIT_SHARE, TOKENIZE_SHARE
from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import BehindDeadline, NeverInTime
from engine.outputs import HeadOutput, RowRequest
from tests.api.test_admission import post
from tests.conftest import TimedRunner

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

TIMEOUT_S = 1.0
SECONDS_PER_CHAR = 4e-6  # the stand-in tokenizer: 0.1 s for one of the burst's inputs, on one thread
# 50 texts of 500 characters: past INLINE_TOKENIZE_CHARS, so on the encoder's thread
TEXT = ("word " * 100).strip() + " "


def large_body(num_texts: int = 50) -> bytes:
    import json

    return json.dumps({"input": [TEXT] * num_texts}).encode()


class Backlogged:
    """A stand-in engine for the guard: `backlog_s` of work queued, an idle rate of 1 ms a token."""

    def __init__(self, backlog_s: float):
        self.backlog_s = backlog_s

    def backlog_seconds(self, num_tokens):
        return self.backlog_s + 1e-3 * num_tokens

    def estimate_seconds(self, num_tokens):
        return 1e-3 * num_tokens


class Call:
    """What the guard reads of a request."""

    def __init__(self):
        self.scope = {"state": {}}
        self.receive = None


def guard_for(engine, timeout_s: float = TIMEOUT_S) -> RequestGuard:
    return RequestGuard(engine, Call(), ServerConfig(request_timeout=timeout_s))


def test_the_guard_admits_tokenization_within_its_share_of_what_the_engine_leaves():
    guard = guard_for(Backlogged(0.3))
    budget = ADMIT_SHARE * TIMEOUT_S - 0.3 - 1e-3 * 10  # what the engine's queue and 10 tokens leave
    start_by = guard.admit_tokenization(0.9 * TOKENIZE_SHARE * budget, 0.01, 10)
    assert isinstance(start_by, StartBy)
    # its parts may start as late as the whole budget allows, less their own time
    assert start_by.at == pytest.approx(guard.times.arrived + ADMIT_SHARE * TIMEOUT_S - 0.31 - 0.01, abs=0.02)
    with pytest.raises(TokenizerBehind, match="too busy to tokenize this request in time") as refused:
        guard.admit_tokenization(1.1 * TOKENIZE_SHARE * budget, 0.01, 10)
    assert isinstance(refused.value, BehindDeadline) and refused.value.retry_after_s >= 1
    # 3 s behind the queue against the 0.45 s it may take: retried after what it would overrun by
    with pytest.raises(TokenizerBehind) as refused:
        guard.admit_tokenization(3.0, 0.01, 10)
    assert refused.value.retry_after_s == 3
    # an engine whose queue alone takes the time: refused as the guard is made, before any tokenization
    with pytest.raises(BehindDeadline) as refused:
        guard_for(Backlogged(0.95))
    assert not isinstance(refused.value, TokenizerBehind) and refused.value.retry_after_s >= 1


def test_the_guard_leaves_alone_what_it_cannot_judge():
    # no deadline, or no measured rate yet: admitted, no start-by
    assert guard_for(Backlogged(10.0), timeout_s=0).admit_tokenization(5.0, 1.0, 10) is None
    assert guard_for(Backlogged(0.3)).admit_tokenization(None, None, 10) is None
    # work an idle engine could not finish in time either: run() refuses it (a 400) on its counted tokens
    assert guard_for(Backlogged(0.0)).admit_tokenization(0.01, 0.01, 2_000) is None


def test_a_part_that_would_start_past_its_start_by_is_refused_unworked():
    pool = TokenizerPool(1)
    release = threading.Event()
    worked: list[int] = []

    def held(part, first):
        release.wait(10)
        worked.append(first)
        return [len(text) for text in part]

    def work(part, first):
        worked.append(first)
        return [len(text) for text in part]

    async def scenario():
        holding = asyncio.ensure_future(pool.map(held, ["x" * 100]))
        await asyncio.sleep(0.05)
        now = time.perf_counter()
        late = asyncio.ensure_future(pool.map(work, ["y" * 300], StartBy(now + 0.01, now, 0.5, 0.6)))
        in_time = asyncio.ensure_future(pool.map(work, ["z" * 50], StartBy(now + 60, now, 0.5, 60.6)))
        await asyncio.sleep(0.05)
        queued = pool.queued_chars
        await asyncio.sleep(0.05)
        release.set()
        return queued, await holding, await late, await in_time

    try:
        queued, held_result, late_result, in_time_result = asyncio.run(scenario())
    finally:
        pool.close()
    assert queued == 450  # the running part and the two queued ones
    assert held_result == [[100]] and in_time_result == [[50]]
    [refusal] = late_result
    assert isinstance(refusal, TokenizerBehind) and "too busy to tokenize" in str(refusal)
    assert worked == [0, 0]  # the held part and the one in time: the late one never ran
    assert pool.queued_chars == 0
    # the two parts that ran measured the rate; the refused one counts nowhere
    assert pool.seconds_per_char is not None and pool.seconds_for(0) == 0


def test_parts_of_a_request_gone_before_they_started_leave_nothing_queued():
    """A request cancelled while its parts waited for a thread (its client gone, its other tokenization
    failed): those parts never run, and their characters must not stay counted as queued, where every later
    request would be judged behind them for good."""
    pool = TokenizerPool(1)
    release = threading.Event()

    def held(part, first):
        release.wait(10)
        return [len(text) for text in part]

    async def scenario():
        holding = asyncio.ensure_future(pool.map(held, ["x" * 100]))
        gone = asyncio.ensure_future(pool.map(held, ["y" * 300, "z" * 300], part_size=1))
        await asyncio.sleep(0.05)
        queued = pool.queued_chars
        gone.cancel()
        await asyncio.sleep(0.05)
        release.set()
        await holding
        return queued

    try:
        queued = asyncio.run(scenario())
    finally:
        pool.close()
    assert queued == 700
    assert pool.queued_chars == 0


def test_the_threads_rate_taken_on_a_busy_host_returns_to_the_idle_sample():
    """The start-up sample (idle threads) is the rate an aged one returns to: parts timed while another
    process took the cores refuse nothing for long once the host is quiet and no part comes."""
    pool = TokenizerPool(1)
    try:
        pool.observe_idle(10_000, 10_000 * 1e-7)
        for _ in range(10):
            pool.observe(10_000, 10_000 * 5e-6)  # fifty times slower
        assert pool.seconds_per_char > 4e-6
        pool._parts.latest_at -= 10 * RECOVERY_HALF_LIFE_S  # quiet since
        assert pool.seconds_per_char == pytest.approx(1e-7, rel=0.05)
        # a request's own time on idle threads is judged at the faster of the two all along
        pool.observe(10_000, 10_000 * 5e-6)
        assert pool.seconds_for(1000, behind_queued=False) == pytest.approx(1000 * 1e-7)
    finally:
        pool.close()


def test_an_input_the_engine_would_refuse_now_is_refused_before_it_is_tokenized(served, monkeypatch):
    """Under a flood the engine's queue stays full to within a request, and every refused request was
    tokenized first (inline, on the loop): refusals came seconds late. Now a guess of its tokens is judged
    first; what the engine would refuse on the guess is a 429 untokenized, and what fits is tokenized."""
    _, model = served
    encoder = model.encoder
    tokenized = []

    def content_ids(texts):
        tokenized.append(texts)
        return [[7] * 5 for _ in texts]

    monkeypatch.setattr(encoder, "content_ids", content_ids)
    behind = guard_for(Backlogged(0.8))  # of the 0.9 s admission allows, 1e-3 s a token
    texts = [("word " * 20).strip()] * 16  # about 320 tokens: 0.32 s, alone within the timeout
    with pytest.raises(BehindDeadline) as refused:
        asyncio.run(encoder.encode_off_loop(texts, None, True, admission=behind))
    assert refused.value.retry_after_s >= 1 and not tokenized
    with pytest.raises(BehindDeadline):
        asyncio.run(encoder.content_ids_off_loop(texts, admission=behind))
    assert not tokenized
    assert asyncio.run(encoder.encode_off_loop(["word"], None, True, admission=behind))  # 0.8 s + a token
    assert tokenized == [["word"]]
    # work that would not fit an idle engine either is left to be counted and refused for good (a 400)
    alone = [("word " * 20).strip()] * 100  # about 2,000 tokens: 2 s
    assert len(asyncio.run(encoder.encode_off_loop(alone, None, True, admission=behind))) == 100


@pytest.fixture(scope="module")
def served():
    server = Server(ServerConfig(request_timeout=TIMEOUT_S, tokenizer_threads=1))
    with TestClient(create_app(server.config, server)) as client:
        model = server.registry().models[0]
        real_engine, real_encoder_pool = model.engine, model.encoder.pool
        engine = Engine(TimedRunner(1e-7, 384), EngineConfig(max_batch_tokens=4096, max_queue_tokens=10**6))
        engine.rate.observe(4096, 4096 * 1e-7)
        engine.start()
        model.engine = engine
        try:
            yield client, model
        finally:
            model.engine = real_engine
            model.encoder.pool = real_encoder_pool
            engine.stop()


def test_a_burst_past_the_tokenizer_gets_200s_in_time_and_429s_up_front(served, monkeypatch):
    client, model = served
    encoder = model.encoder
    assert 50 * len(TEXT) > INLINE_TOKENIZE_CHARS
    encode = encoder.encode

    def slow_encode(texts, *args, **kwargs):  # a tokenizer of known speed, on the encoder's thread
        time.sleep(SECONDS_PER_CHAR * sum(map(len, texts)))
        return encode(texts, *args, **kwargs)

    monkeypatch.setattr(encoder, "encode", slow_encode)
    pool = TokenizerPool(1)  # no rate yet: the first request measures the stand-in's
    monkeypatch.setattr(encoder, "pool", pool)
    try:
        answers, waited = burst_of(client, encoder, monkeypatch)
        # 0.8 s alone: past the share of the whole timeout that tokenization may take on idle threads
        refused = client.post("/v1/embeddings", content=large_body(400))
    finally:
        pool.close()
    statuses = [status for status, _, _ in answers]
    assert set(statuses) == {200, 429}, statuses
    # TOKENIZE_SHARE of 0.9 s is 0.45 s of tokenization admitted: about four inputs
    assert 2 <= statuses.count(200) <= 8
    assert all(int(headers[b"retry-after"]) >= 1 for status, headers, _ in answers if status == 429)
    # no late 200s, and only the admitted ones reached the thread: the rest were refused before waiting
    assert max(seconds for status, _, seconds in answers if status == 200) < TIMEOUT_S
    assert len(waited) == statuses.count(200)
    # which no retry passes: a 400 naming the limit, not a 429 that would come back every time
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
    message = refused.json()["error"]["message"]
    assert "tokenizing this request would take about" in message and "--request-timeout" in message
    assert "retry-after" not in refused.headers


def burst_of(client, encoder, monkeypatch):
    """One request to measure the stand-in's rate, then 30 at once: (their answers, the start-by of each
    request whose parts went to the thread)."""
    assert client.post("/v1/embeddings", content=large_body()).status_code == 200
    waited = []
    map_parts = encoder.pool.map

    async def counted_map(work, texts, start_by=None):
        waited.append(start_by)
        return await map_parts(work, texts, start_by)

    monkeypatch.setattr(encoder.pool, "map", counted_map)

    async def burst():
        # 30 inputs of 0.1 s each on one thread: 3 s of tokenization against a 1 s timeout
        return await asyncio.gather(*(post(client.app, "/v1/embeddings", large_body()) for _ in range(30)))

    return client.blocking_portal.call(burst), waited


def test_a_vision_language_requests_patches_count_in_its_estimate():
    """Work an idle engine could not finish in time is a 400 before it is queued: a vision-language model's
    image patches (its vision tower's rows, four a token) count in that estimate as in the engine's queue."""

    class VisionLanguage(Backlogged):
        output = HeadOutput("sequence", 8, ("embed",), takes_images=True, image_run=(5, 2))

        def enqueue(self, token_ids, token_type_ids=None, deadline=None, rows=None):
            raise AssertionError("refused work reached the engine")

    grid = np.zeros((40, 40, 3), dtype=np.uint8)  # 1,600 patches: 1.6 s at 1 ms each, past the 1 s timeout
    sequence = [[1, *[5] * 400, 2]]  # its 400 merged tokens: 0.4 s alone
    guard = guard_for(VisionLanguage(0.0))
    with pytest.raises(NeverInTime):
        asyncio.run(guard.run(sequence, rows=RowRequest(images=[grid])))


def test_image_decoding_behind_a_busy_queue_is_refused_before_it_waits():
    """An image request's decoding is admitted as a text's tokenization is: behind what is queued on the
    image threads (at their measured rate per character of the images' sources), it must fit the share of
    the deadline the engine's queue leaves, else a 429 before it waits and without being decoded."""
    from types import SimpleNamespace

    from api.image_inputs import ImageInput, decoded_images
    from api.images import ImageLimits

    pool = TokenizerPool(1)
    pool.observe(1000, 1.0)  # 1 ms a character
    release = threading.Event()

    async def scenario():
        held = asyncio.ensure_future(pool.map(lambda part, first: release.wait(10), ["x" * 2000]))
        await asyncio.sleep(0.05)  # another request's 2 s of images hold the one thread
        layout = SimpleNamespace(image_size=None, max_num_patches=None, num_tokens=0)
        model = SimpleNamespace(spec=SimpleNamespace(images=layout), image_pool=pool)
        images = [ImageInput("y" * 100, "input[0]")]
        try:
            with pytest.raises(TokenizerBehind):
                await decoded_images(model, images, guard_for(Backlogged(0.0)), ImageLimits())
        finally:
            release.set()
            await held

    asyncio.run(scenario())  # (decoded, its "y"s would be a 400 of bad base64, not a 429)
    assert pool.queued_chars == 0
    pool.close()


def test_parts_of_a_given_size_start_largest_first_and_come_back_in_order():
    # one thread takes the parts one at a time: images of different sizes in parts of one start largest
    # first, so that threads taking the next part as each is free end together
    pool = TokenizerPool(1)
    started: list[str] = []

    def work(part, first):
        started.extend(part)
        return [(first + offset, text) for offset, text in enumerate(part)]

    texts = ["bb", "dddd", "a", "ccc"]
    try:
        results = asyncio.run(pool.map(work, texts, part_size=1))
        assert results == [[(0, "bb")], [(1, "dddd")], [(2, "a")], [(3, "ccc")]]
        assert started == ["dddd", "ccc", "bb", "a"]
        started.clear()
        assert asyncio.run(pool.map(work, texts)) == [[(0, "bb"), (1, "dddd"), (2, "a"), (3, "ccc")]]
    finally:
        pool.close()
